// The SDK against a real cubicled: CUBICLE_URL and CUBICLE_API_KEY name it
// (test/e2e/sdk_typescript_test.go starts one on gvisor and sets them), and
// CUBICLE_SDK_BACKEND the backend to create on (default: the daemon's).
// It makes two sandboxes, a desktop that most tests share and a second
// one for create without wait and the list filters, and destroys both.
//
// Without CUBICLE_URL the suite skips, saying why; under
// CUBICLE_REQUIRE_E2E=1 it fails instead.

import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";

import {
  Cubicle,
  CubicleError,
  ConflictError,
  InvalidArgumentError,
  NotFoundError,
  NotSupportedError,
  UnauthorizedError,
  decodeBase64,
} from "../dist/index.js";

const url = process.env.CUBICLE_URL;
const backend = process.env.CUBICLE_SDK_BACKEND || undefined;
const required = process.env.CUBICLE_REQUIRE_E2E === "1";

if (!url) {
  const why = "CUBICLE_URL is not set: this suite needs a running cubicled (go test -run TestTypeScriptSDK ./test/e2e/ starts one)";
  if (required) {
    test("real cubicled", () => assert.fail(`${why}; CUBICLE_REQUIRE_E2E=1 forbids skipping`));
  } else {
    test("real cubicled", { skip: why }, () => {});
  }
} else {
  realDaemonSuite();
}

const W = 1024, H = 768;

/** eventually polls cond (async) every 250 ms until it returns a truthy value or ms pass. */
async function eventually(what, ms, cond) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    last = await cond();
    if (last) return last;
    if (Date.now() > deadline) assert.fail(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** pngSize reads the width and height of a PNG's IHDR chunk, checking its magic. */
function pngSize(b) {
  assert.ok(b instanceof Uint8Array, "screenshot is a Uint8Array");
  assert.deepEqual([...b.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], "PNG magic");
  const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
  return { width: v.getUint32(16), height: v.getUint32(20) };
}

const page = `<!doctype html>
<html><head><meta charset="utf-8"><title>cubicle sdk</title>
<style>html, body { margin: 0; height: 100%; } #pad { position: fixed; inset: 0; background: #c0392b; }
#field { position: fixed; left: 10px; top: 10px; width: 300px; }</style></head>
<body><div id="pad"></div><input id="field" autocomplete="off">
<script>
  const pad = document.getElementById('pad'), field = document.getElementById('field');
  pad.addEventListener('click', () => { document.title = 'clicked'; field.focus(); });
  field.addEventListener('input', () => { document.title = 'typed: ' + field.value; });
</script></body></html>`;

function realDaemonSuite() {
  const cubicle = new Cubicle({ timeoutMs: 120_000 }); // CUBICLE_URL, CUBICLE_API_KEY
  const run = randomBytes(4).toString("hex");
  const made = new Set();
  let sb;

  describe("real cubicled", () => {
    before(async () => {
      sb = await cubicle.create({
        backend,
        resolution: { width: W, height: H },
        timeout_seconds: 600,
        idle_timeout_seconds: 300,
        metadata: { suite: run, role: "main" },
        env: { SDK_TEST: "yes" },
      });
      made.add(sb.id);
    });

    after(async () => {
      // Leave nothing running, whatever failed.
      for (const id of made) {
        await cubicle.destroy(id).catch(() => {});
      }
    });

    test("health and info", async () => {
      assert.deepEqual(await cubicle.health(), { status: "ok" });
      const info = await cubicle.info();
      assert.equal(typeof info.version, "string");
      const b = info.backends.find((x) => x.name === sb.backend);
      assert.ok(b?.available, `backend ${sb.backend} available in ${JSON.stringify(info.backends)}`);
      assert.ok(info.capacity.running >= 1);
    });

    test("create returns a running desktop; get agrees", async () => {
      assert.match(sb.id, /^[a-z0-9]+$/);
      assert.equal(sb.state, "running");
      if (backend) assert.equal(sb.backend, backend);
      assert.deepEqual(sb.resolution, { width: W, height: H });
      assert.deepEqual(sb.metadata, { suite: run, role: "main" });
      const got = await cubicle.get(sb.id);
      assert.equal(got.id, sb.id);
      assert.equal(got.state, "running");
      assert.ok(Date.parse(got.expires_at) > Date.now());
    });

    test("screenshot: PNG of the screen's size, downscaled on request", async () => {
      assert.deepEqual(pngSize(await cubicle.screenshot(sb.id)), { width: W, height: H });
      assert.deepEqual(pngSize(await cubicle.screenshot(sb.id, { width: 512 })), { width: 512, height: 384 });
      const jpeg = await cubicle.screenshot(sb.id, { format: "jpeg", quality: 60, scale: 0.5 });
      assert.deepEqual([...jpeg.subarray(0, 3)], [0xff, 0xd8, 0xff], "JPEG magic");
      // The screenshot action answers base64.
      const r = await cubicle.action(sb.id, { type: "screenshot", x: 0, y: 0, w: 100, h: 50 });
      assert.equal(r.format, "png");
      assert.deepEqual(pngSize(decodeBase64(r.data)), { width: 100, height: 50 });
    });

    test("move: the pointer is where the X server says", async () => {
      await cubicle.move(sb.id, 123, 234);
      const res = await cubicle.exec(sb.id, { argv: ["xdotool", "getmouselocation", "--shell"] });
      assert.equal(res.exit_code, 0, res.stderr);
      assert.match(res.stdout, /^X=123$/m);
      assert.match(res.stdout, /^Y=234$/m);
      assert.deepEqual(await cubicle.cursorPosition(sb.id), { x: 123, y: 234 });
      assert.deepEqual(await cubicle.screenSize(sb.id), { width: W, height: H });
      const list = await cubicle.actions(sb.id, [{ type: "move", x: 5, y: 6 }, { type: "cursor_position" }]);
      assert.deepEqual(list.results.map((r) => r.type), ["move", "cursor_position"]);
      assert.equal(list.results[1].x, 5);
      assert.equal(list.results[1].y, 6);
    });

    test("exec: stdout, stderr, exit code, env and DISPLAY", async () => {
      const res = await cubicle.exec(sb.id, { command: 'echo "out:$DISPLAY:$SDK_TEST:$X"; echo err >&2; exit 3', env: { X: "y" } });
      assert.equal(res.exit_code, 3);
      assert.equal(res.stdout, "out::0:yes:y\n");
      assert.equal(res.stderr, "err\n");
      assert.equal(typeof res.duration_ms, "number");
      const stdin = await cubicle.exec(sb.id, { argv: ["cat"], stdin: "fed ✓" });
      assert.equal(stdin.stdout, "fed ✓");
    });

    test("execStream: chunks as they come, then the exit code", async () => {
      const stream = await cubicle.execStream(sb.id, {
        argv: ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2; exit 5"],
      });
      const events = [];
      for await (const ev of stream) events.push(ev);
      const out = events.filter((e) => e.type === "stdout");
      assert.equal(out.map((e) => e.data).join(""), "line1\nline2\nline3\n");
      assert.ok(out.length >= 2, `stdout came in ${out.length} chunk(s), want it streamed in several: ${JSON.stringify(events)}`);
      assert.equal(events.filter((e) => e.type === "stderr").map((e) => e.data).join(""), "oops\n");
      const last = events.at(-1);
      assert.equal(last.type, "exit");
      assert.equal(last.exit_code, 5);
      assert.equal(stream.exitCode, 5);

      const res = await (await cubicle.execStream(sb.id, { command: "printf 'héllo'; exit 0" })).wait();
      assert.equal(res.stdout, "héllo");
      assert.equal(res.exit_code, 0);
    });

    test("clipboard: set, then get, any Unicode", async () => {
      for (const text of [`cubicle clipboard ✓ ${run}`, "Grüße 東京 😀"]) {
        await cubicle.clipboardSet(sb.id, text);
        assert.equal(await cubicle.clipboardGet(sb.id), text);
      }
    });

    test("metrics: a sample comes one interval after the start", async () => {
      const m = await cubicle.metrics(sb.id);
      assert.equal(m.sandbox_id, sb.id);
      assert.equal(m.state, "running");
      assert.ok(m.interval_seconds > 0);
      const latest = await eventually("a metrics sample", 30_000, async () => (await cubicle.metrics(sb.id)).latest);
      assert.ok(latest.memory.used_bytes > 0, JSON.stringify(latest));
      assert.ok(latest.cpu.count > 0 && latest.cpu.percent >= 0 && latest.cpu.percent <= 100, JSON.stringify(latest.cpu));
      const later = new Date(Date.parse(latest.timestamp) + 3600_000);
      assert.deepEqual((await cubicle.metrics(sb.id, { since: later })).samples, []);
    });

    test("logs: the agent's lines, and what a program prints", async () => {
      const logs = await cubicle.logs(sb.id);
      assert.ok(logs.some((e) => e.source === "agent" && e.message === "session: started" && e.fields?.program),
        JSON.stringify(logs.slice(0, 20)));
      // A root process may write on the agent's stdout: that is the console.
      const marker = `cubicle-sdk-ts-log-${run}`;
      const since = logs.at(-1)?.timestamp;
      const res = await cubicle.exec(sb.id, { command: `echo ${marker} > /proc/1/fd/1` });
      assert.equal(res.exit_code, 0, res.stderr);
      const found = await eventually("the marker in the logs", 20_000, async () => {
        const got = await cubicle.logs(sb.id, { since, search: marker });
        return got.length > 0 && got;
      });
      assert.deepEqual(found.map((e) => [e.source, e.level, e.message]), [["console", "info", marker]]);
      assert.deepEqual(await cubicle.logs(sb.id, { since: found[0].timestamp, search: marker }), []);
      assert.equal((await cubicle.logs(sb.id, { limit: 1 })).length, 1);
      await assert.rejects(cubicle.logs(sb.id, { level: "loud" }), InvalidArgumentError);
    });

    test("files: write, read, list, delete", async () => {
      const blob = randomBytes(200_000);
      const info = await cubicle.writeFile(sb.id, "/tmp/sdk/dir/blob.bin", blob);
      assert.deepEqual(info, { path: "/tmp/sdk/dir/blob.bin", size: blob.length });
      assert.deepEqual(Buffer.from(await cubicle.readFile(sb.id, "/tmp/sdk/dir/blob.bin")), blob);
      // The sandbox's own programs see the same bytes.
      const sum = await cubicle.exec(sb.id, { argv: ["sha256sum", "/tmp/sdk/dir/blob.bin"] });
      assert.equal(sum.stdout.split(" ")[0], createHash("sha256").update(blob).digest("hex"));
      await cubicle.writeFile(sb.id, "/tmp/sdk/dir/note.txt", "grüße\n");
      assert.equal(await cubicle.readFileText(sb.id, "/tmp/sdk/dir/note.txt"), "grüße\n");
      const entries = await cubicle.listFiles(sb.id, "/tmp/sdk/dir");
      assert.deepEqual(entries.map((e) => [e.name, e.type, e.size]).sort(), [["blob.bin", "file", blob.length], ["note.txt", "file", Buffer.byteLength("grüße\n")]]);
      await cubicle.deleteFile(sb.id, "/tmp/sdk/dir/blob.bin");
      await assert.rejects(cubicle.readFile(sb.id, "/tmp/sdk/dir/blob.bin"), NotFoundError);
    });

    test("list: state and metadata filters; create without wait", async () => {
      const second = await cubicle.create({ backend, metadata: { suite: run, role: "second" } }, { wait: false });
      made.add(second.id);
      assert.equal(second.state, "starting");
      const mine = await cubicle.list({ metadata: { suite: run } });
      assert.deepEqual(mine.map((s) => s.id).sort(), [sb.id, second.id].sort());
      const main = await cubicle.list({ state: "running", metadata: { suite: run, role: "main" } });
      assert.deepEqual(main.map((s) => s.id), [sb.id]);
      assert.deepEqual(await cubicle.list({ metadata: { suite: "other-" + run } }), []);
      const up = await eventually("the second sandbox to start", 60_000, async () => {
        const s = await cubicle.get(second.id);
        return s.state !== "starting" && s;
      });
      assert.equal(up.state, "running", up.error);
      await cubicle.destroy(second.id);
      const stopped = await cubicle.list({ state: "stopped", metadata: { suite: run } });
      assert.deepEqual(stopped.map((s) => s.id), [second.id]);
    });

    test("errors: not found, bad actions with their index, wrong key, not running", async () => {
      await assert.rejects(cubicle.get("doesnotexist0"), (err) => {
        assert.ok(err instanceof NotFoundError);
        assert.equal(err.status, 404);
        assert.equal(err.code, "not_found");
        return true;
      });
      await assert.rejects(cubicle.destroy("doesnotexist0"), NotFoundError);
      await assert.rejects(cubicle.actions(sb.id, [{ type: "move", x: 10, y: 10 }, { type: "key", keys: "ctrl+notakeyxyz" }]), (err) => {
        assert.ok(err instanceof InvalidArgumentError, `${err}`);
        assert.equal(err.status, 400);
        assert.equal(err.index, 1);
        assert.match(err.message, /notakeyxyz/);
        return true;
      });
      await assert.rejects(cubicle.click(sb.id, W + 10, 5), (err) => err instanceof InvalidArgumentError && err.index === 0);
      await assert.rejects(cubicle.actions(sb.id, { type: "no_such_action" }), InvalidArgumentError);
      await assert.rejects(cubicle.exec(sb.id, {}), InvalidArgumentError);
      for (const apiKey of ["wrong-key", ""]) {
        // apiKey "" sends none (it does not fall back to CUBICLE_API_KEY).
        const stranger = new Cubicle({ baseUrl: url, apiKey, retry: { maxRetries: 0 } });
        await assert.rejects(stranger.list(), (err) => {
          assert.ok(err instanceof UnauthorizedError, `${err}`);
          assert.equal(err.status, 401);
          assert.equal(err.code, "unauthorized");
          return true;
        });
      }
      if (sb.backend === "runc") {
        // runc cannot fork or snapshot; the daemon says so honestly.
        await assert.rejects(cubicle.fork(sb.id, 1), NotSupportedError);
        await assert.rejects(cubicle.createSnapshot(sb.id, { name: "s-" + run }), NotSupportedError);
      }
    });

    test("fork and snapshot: a copy holds the file the sandbox wrote", async (t) => {
      if (sb.backend === "runc") {
        t.skip("runc does not copy (above)");
        return;
      }
      await cubicle.exec(sb.id, { command: `echo ${run} > ~/sdk-copy` });
      const [f] = await cubicle.fork(sb.id, 1);
      try {
        assert.equal(f.state, "running");
        assert.notEqual(f.id, sb.id);
        assert.equal((await cubicle.exec(f.id, { command: "cat ~/sdk-copy" })).stdout, `${run}\n`);
      } finally {
        await cubicle.destroy(f.id);
      }
      const snap = await cubicle.createSnapshot(sb.id, { name: "s-" + run });
      try {
        const c = await cubicle.create({ from_snapshot: snap.id });
        try {
          assert.equal((await cubicle.exec(c.id, { command: "cat ~/sdk-copy" })).stdout, `${run}\n`);
        } finally {
          await cubicle.destroy(c.id);
        }
      } finally {
        await cubicle.deleteSnapshot(snap.id);
      }
    });

    test("volumes and snapshots: create, get, list, delete", async () => {
      const name = "sdk-" + run;
      const v = await cubicle.createVolume(name, 64);
      assert.equal(v.name, name);
      assert.equal(v.size_mb, 64);
      await assert.rejects(cubicle.createVolume(name, 64), ConflictError);
      assert.equal((await cubicle.getVolume(name)).name, name);
      assert.ok((await cubicle.listVolumes()).some((x) => x.name === name));
      await cubicle.deleteVolume(name);
      await assert.rejects(cubicle.getVolume(name), NotFoundError);
      assert.deepEqual(await cubicle.listSnapshots({ sandbox_id: sb.id }), []);
      await assert.rejects(cubicle.getSnapshot("nosuchsnapshot"), NotFoundError);
    });

    test("view link and timeout", async () => {
      const view = await cubicle.view(sb.id, { ttl_seconds: 60 });
      assert.ok(view.url.includes(`/view/${sb.id}?token=`), view.url);
      assert.equal(view.view_only, true);
      assert.ok(Date.parse(view.expires_at) > Date.now());
      const before = Date.parse((await cubicle.get(sb.id)).expires_at);
      const extended = await cubicle.setTimeout(sb.id, 900);
      assert.ok(Date.parse(extended.expires_at) > before, `expires_at ${extended.expires_at} not after ${new Date(before).toISOString()}`);
    });

    test("click and type reach a page in Chromium", async () => {
      await cubicle.writeFile(sb.id, "/tmp/sdk-page.html", page);
      // want is a substring of a window's title, or a RegExp it matches.
      const title = async (want) =>
        eventually(`a window titled ${want}`, 60_000, async () =>
          (await cubicle.windows(sb.id)).some((w) => (want instanceof RegExp ? want.test(w.title) : w.title.includes(want))),
        );
      await eventually("Chromium's window", 60_000, async () =>
        (await cubicle.windows(sb.id)).some((w) => /chromium/i.test(w.class)),
      );
      await cubicle.actions(sb.id, [
        { type: "key", keys: "ctrl+l" },
        { type: "type", text: "file:///tmp/sdk-page.html" },
        { type: "key", keys: "Return" },
      ]);
      await title("cubicle sdk");
      await cubicle.click(sb.id, 512, 450);
      await title("clicked");
      await cubicle.type(sb.id, "héllo ✓");
      await title("typed: héllo ✓");
      // A key combination as a list: select all, then type over it.
      await cubicle.key(sb.id, ["ctrl", "a"]);
      await cubicle.type(sb.id, "x");
      await title(/^typed: x( - |$)/);
    });

    test("vendor computer-use endpoints: Anthropic's tool_result, OpenAI's computer_call_output", async () => {
      // The screen is 1024×768; a 512×384 display halves it.
      const tool = { type: "computer_20251124", name: "computer", display_width_px: 512, display_height_px: 384 };
      const shot = await cubicle.computerAnthropic(sb.id, { tool, input: { action: "screenshot" } });
      assert.equal(shot.type, "tool_result");
      assert.equal(shot.is_error, false);
      assert.equal(shot.content[0].source.media_type, "image/png");
      assert.deepEqual(pngSize(decodeBase64(shot.content[0].source.data)), { width: 512, height: 384 });
      await cubicle.computerAnthropic(sb.id, { tool, input: { action: "mouse_move", coordinate: [100, 50] } });
      const pos = await cubicle.cursorPosition(sb.id);
      assert.deepEqual([pos.x, pos.y], [201, 101], "model (100, 50) at half size is screen (201, 101)");
      const cur = await cubicle.computerAnthropic(sb.id, { tool, input: { action: "cursor_position" } });
      assert.equal(cur.content[0].text, "X=100,Y=50");
      // Bad input: 400, and the tool_result for the model in the body.
      await assert.rejects(
        cubicle.computerAnthropic(sb.id, { tool, input: { action: "left_click", coordinate: [600, 10] } }),
        (err) => err instanceof InvalidArgumentError && /outside the screen/.test(err.message) && JSON.stringify(err.body).includes('"is_error":true'),
      );
      const out = await cubicle.computerOpenAI(sb.id, {
        computer_call: { type: "computer_call", call_id: "call_1", action: { type: "move", x: 300, y: 200 }, pending_safety_checks: [] },
      });
      assert.equal(out.type, "computer_call_output");
      assert.equal(out.call_id, "call_1");
      assert.match(out.output.image_url, /^data:image\/png;base64,/);
      const moved = await cubicle.cursorPosition(sb.id);
      assert.deepEqual([moved.x, moved.y], [300, 200]);
    });

    test("destroy: the sandbox stops; acting on it is a conflict", async () => {
      await cubicle.destroy(sb.id);
      made.delete(sb.id);
      assert.equal((await cubicle.get(sb.id)).state, "stopped");
      await assert.rejects(cubicle.click(sb.id, 1, 1), (err) => err instanceof ConflictError && err instanceof CubicleError);
    });
  });
}
