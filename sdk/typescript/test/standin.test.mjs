// Unit tests of the SDK's HTTP layer (retries, Retry-After, aborts, error
// mapping, request shapes) against a stand-in for cubicled: a local
// node:http server that answers what each test scripts. It is not the
// daemon; sandbox.test.mjs runs against the real one.

import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import {
  Cubicle,
  CubicleError,
  ConnectionError,
  NotFoundError,
  UnavailableError,
  RateLimitedError,
  InvalidArgumentError,
  UnauthorizedError,
  CapacityExhaustedError,
  ConflictError,
  errorFor,
} from "../dist/index.js";

/**
 * standIn starts a stand-in daemon whose handler answers each request;
 * it records every request (method, url, headers, body).
 */
async function standIn(t, handler) {
  const requests = [];
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const rec = { method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks) };
    requests.push(rec);
    await handler(req, res, requests.length, rec);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    server.closeAllConnections();
    return new Promise((resolve) => server.close(resolve));
  });
  const url = `http://127.0.0.1:${server.address().port}`;
  return { url, requests };
}

function json(res, status, body, headers = {}) {
  res.writeHead(status, { "Content-Type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

function apiError(res, status, code, message, extra = {}, headers = {}) {
  json(res, status, { error: { code, message, ...extra } }, headers);
}

const fast = { baseDelayMs: 5, maxDelayMs: 2000 };

test("stand-in: a GET answered 503 then 200 is retried and succeeds", async (t) => {
  const s = await standIn(t, (req, res, n) => {
    if (n === 1) return apiError(res, 503, "unavailable", "temporarily unavailable");
    json(res, 200, { id: "abc", state: "running" });
  });
  const c = new Cubicle({ baseUrl: s.url, apiKey: "k1", retry: fast });
  const sb = await c.get("abc");
  assert.equal(sb.state, "running");
  assert.equal(s.requests.length, 2);
  for (const r of s.requests) {
    assert.equal(r.method, "GET");
    assert.equal(r.url, "/v1/sandboxes/abc");
    assert.equal(r.headers["x-api-key"], "k1");
  }
});

test("stand-in: 502 and 504 are retried too; giving up throws the last error", async (t) => {
  const s = await standIn(t, (req, res, n) => {
    if (n % 2 === 1) return apiError(res, 502, "", "");
    apiError(res, 504, "timeout", "timed out");
  });
  const c = new Cubicle({ baseUrl: s.url, retry: { ...fast, maxRetries: 2 } });
  await assert.rejects(c.list(), (err) => {
    assert.ok(err instanceof CubicleError);
    assert.equal(err.status, 502); // attempts: 502, 504, 502
    assert.equal(err.code, "unavailable"); // derived from the status: the body had no code
    return true;
  });
  assert.equal(s.requests.length, 3);
});

test("stand-in: 429 waits as long as Retry-After says", async (t) => {
  const s = await standIn(t, (req, res, n) => {
    if (n === 1) return apiError(res, 429, "rate_limited", "too many requests", {}, { "Retry-After": "1" });
    json(res, 200, { entries: [{ name: "a", path: "/a", type: "file", size: 1, mode: 420 }] });
  });
  const c = new Cubicle({ baseUrl: s.url, retry: fast });
  const start = Date.now();
  const entries = await c.listFiles("abc", "/");
  const waited = Date.now() - start;
  assert.equal(entries.length, 1);
  assert.equal(s.requests.length, 2);
  assert.ok(waited >= 950, `retried after ${waited} ms, want ≥ 1000 (Retry-After: 1)`);
});

test("stand-in: a Retry-After longer than maxDelayMs is not waited for", async (t) => {
  const s = await standIn(t, (req, res) => apiError(res, 429, "rate_limited", "slow down", {}, { "Retry-After": "120" }));
  const c = new Cubicle({ baseUrl: s.url, retry: fast });
  await assert.rejects(c.info(), (err) => {
    assert.ok(err instanceof RateLimitedError);
    assert.equal(err.retryAfterMs, 120_000);
    return true;
  });
  assert.equal(s.requests.length, 1);
});

test("stand-in: create, exec and actions (POST) are never retried", async (t) => {
  const s = await standIn(t, (req, res) => apiError(res, 503, "capacity_exhausted", "no capacity for another sandbox"));
  const c = new Cubicle({ baseUrl: s.url, retry: fast });
  await assert.rejects(c.create({ backend: "gvisor" }), CapacityExhaustedError);
  await assert.rejects(c.exec("abc", { command: "true" }), CapacityExhaustedError);
  await assert.rejects(c.execStream("abc", { command: "true" }), CapacityExhaustedError);
  await assert.rejects(c.click("abc", 1, 2), CapacityExhaustedError);
  assert.deepEqual(
    s.requests.map((r) => `${r.method} ${r.url}`),
    ["POST /v1/sandboxes", "POST /v1/sandboxes/abc/exec", "POST /v1/sandboxes/abc/exec", "POST /v1/sandboxes/abc/actions"],
  );
});

test("stand-in: a dropped connection is retried for idempotent calls only", async (t) => {
  const s = await standIn(t, (req, res, n) => {
    if (n === 1 || n === 3) return req.socket.destroy(); // no answer at all
    res.writeHead(200, { "Content-Type": "image/png" });
    res.end(Buffer.from([0x89, 0x50, 0x4e, 0x47]));
  });
  const c = new Cubicle({ baseUrl: s.url, retry: fast });
  const png = await c.screenshot("abc", { format: "png", scale: 0.5 });
  assert.deepEqual([...png], [0x89, 0x50, 0x4e, 0x47]);
  assert.equal(s.requests[1].url, "/v1/sandboxes/abc/screenshot?format=png&scale=0.5");
  await assert.rejects(c.exec("abc", { command: "true" }), ConnectionError);
  assert.equal(s.requests.length, 3);
});

test("stand-in: PUT of a file is retried with the same bytes", async (t) => {
  const s = await standIn(t, (req, res, n, rec) => {
    if (n === 1) return apiError(res, 503, "unavailable", "the sandbox's agent is unavailable");
    json(res, 200, { path: "/tmp/x", size: rec.body.length });
  });
  const c = new Cubicle({ baseUrl: s.url, retry: fast });
  const data = new Uint8Array([0, 1, 2, 255]);
  const info = await c.writeFile("abc", "/tmp/x y", data);
  assert.equal(info.size, 4);
  assert.equal(s.requests.length, 2);
  for (const r of s.requests) {
    assert.equal(r.method, "PUT");
    assert.equal(r.url, "/v1/sandboxes/abc/files?path=%2Ftmp%2Fx+y");
    assert.deepEqual([...r.body], [0, 1, 2, 255]);
    assert.equal(r.headers["content-type"], "application/octet-stream");
  }
});

test("stand-in: an abort during the backoff rejects with the abort reason at once", async (t) => {
  const s = await standIn(t, (req, res) => apiError(res, 503, "unavailable", "busy"));
  const c = new Cubicle({ baseUrl: s.url, retry: { maxRetries: 5, baseDelayMs: 5000, maxDelayMs: 5000 } });
  const ctl = new AbortController();
  const start = Date.now();
  setTimeout(() => ctl.abort(), 200);
  await assert.rejects(c.get("abc", { signal: ctl.signal }), (err) => err.name === "AbortError");
  assert.ok(Date.now() - start < 2000, "the abort did not cut the backoff short");
  assert.equal(s.requests.length, 1);
});

test("stand-in: timeoutMs bounds a call", async (t) => {
  const s = await standIn(t, () => {}); // never answers
  const c = new Cubicle({ baseUrl: s.url, timeoutMs: 200, retry: fast });
  await assert.rejects(c.info(), (err) => err.name === "TimeoutError" && !(err instanceof CubicleError));
});

test("stand-in: error bodies map to classes with status, code, message and index", async (t) => {
  const s = await standIn(t, (req, res) => {
    if (req.url.endsWith("/actions")) {
      return json(res, 400, { error: { code: "invalid_argument", message: "action 1: unknown key", index: 1 }, results: [{ type: "move" }] });
    }
    if (req.url.startsWith("/v1/sandboxes/gone")) return apiError(res, 409, "conflict", "sandbox gone is stopped");
    if (req.url.startsWith("/v1/sandboxes/new")) return apiError(res, 418, "brand_new_code", "something new");
    if (req.url.startsWith("/v1/volumes")) {
      res.writeHead(404, { "Content-Type": "text/html" });
      return res.end("<html>not here</html>");
    }
    apiError(res, 401, "unauthorized", "missing or invalid API key");
  });
  const c = new Cubicle({ baseUrl: s.url, retry: fast });
  await assert.rejects(c.actions("abc", [{ type: "move", x: 1, y: 1 }, { type: "key", keys: "nope" }]), (err) => {
    assert.ok(err instanceof InvalidArgumentError);
    assert.ok(err instanceof CubicleError);
    assert.equal(err.status, 400);
    assert.equal(err.code, "invalid_argument");
    assert.equal(err.index, 1);
    assert.equal(err.message, "action 1: unknown key");
    assert.deepEqual(err.body.results, [{ type: "move" }]);
    return true;
  });
  await assert.rejects(c.get("gone"), ConflictError);
  await assert.rejects(c.get("new"), (err) => {
    assert.equal(err.constructor, CubicleError);
    assert.equal(err.code, "brand_new_code");
    assert.equal(err.status, 418);
    return true;
  });
  await assert.rejects(c.getVolume("v"), (err) => {
    assert.ok(err instanceof NotFoundError); // derived from the status
    assert.equal(err.message, "<html>not here</html>");
    return true;
  });
  await assert.rejects(c.info(), UnauthorizedError);
  assert.ok(errorFor(503, "unavailable", "x") instanceof UnavailableError);
});

test("stand-in: request shapes: create, list filters, single action, view", async (t) => {
  const s = await standIn(t, (req, res) => {
    if (req.url === "/v1/sandboxes?wait=false") return json(res, 201, { id: "abc", state: "starting" });
    if (req.url.startsWith("/v1/sandboxes?")) return json(res, 200, { sandboxes: [] });
    if (req.url.endsWith("/actions")) return json(res, 200, { results: [{ type: "cursor_position", x: 3, y: 4 }], duration_ms: 1 });
    if (req.method === "DELETE") {
      res.writeHead(204);
      return res.end();
    }
    json(res, 200, {});
  });
  const c = new Cubicle({ baseUrl: s.url + "/", retry: fast });
  const sb = await c.create(
    { backend: "gvisor", resolution: { width: 800, height: 600 }, volumes: [{ name: "v", path: "/home/user" }], from_snapshot: undefined },
    { wait: false },
  );
  assert.equal(sb.state, "starting");
  assert.deepEqual(JSON.parse(s.requests[0].body), { backend: "gvisor", resolution: { width: 800, height: 600 }, volumes: [{ name: "v", path: "/home/user" }] });
  await c.list({ state: "running", metadata: { team: "a b", k: "v" } });
  assert.equal(s.requests[1].url, "/v1/sandboxes?state=running&metadata.team=a+b&metadata.k=v");
  assert.deepEqual(await c.cursorPosition("abc"), { x: 3, y: 4 });
  assert.deepEqual(JSON.parse(s.requests[2].body), { type: "cursor_position" });
  await c.destroy("abc");
  assert.equal(s.requests[3].method, "DELETE");
  await c.view("a/b", { ttl_seconds: 60, view_only: true });
  assert.equal(s.requests[4].url, "/v1/sandboxes/a%2Fb/view");
  assert.deepEqual(JSON.parse(s.requests[4].body), { ttl_seconds: 60, view_only: true });
  assert.throws(() => c.get(""), TypeError);
});

test("stand-in: execStream yields chunks and the exit code; an error line is thrown", async (t) => {
  const s = await standIn(t, (req, res, n) => {
    assert.equal(req.headers.accept, "application/x-ndjson");
    res.writeHead(200, { "Content-Type": "application/x-ndjson" });
    if (n === 1) {
      // A line split across writes, and a character split across them.
      res.write('{"stdout":"he');
      res.write('llo\\n"}\n{"stderr":"w\u00f6');
      res.write('rld"}\n{"truncated":true}\n{"exit_code":3,"duration_ms":7}\n');
      return res.end();
    }
    if (n === 2) {
      res.write('{"stdout":"x"}\n{"error":{"code":"timeout","message":"the sandbox did not answer in time"}}\n');
      return res.end();
    }
    res.end('{"stdout":"cut"}\n');
  });
  const c = new Cubicle({ baseUrl: s.url, retry: fast });
  const stream = await c.execStream("abc", { argv: ["sh", "-c", "x"] });
  const events = [];
  for await (const ev of stream) events.push(ev);
  assert.deepEqual(events, [
    { type: "stdout", data: "hello\n" },
    { type: "stderr", data: "wörld" },
    { type: "truncated" },
    { type: "exit", exit_code: 3, duration_ms: 7 },
  ]);
  assert.equal(stream.exitCode, 3);
  await assert.rejects((await c.execStream("abc", { command: "x" })).wait(), (err) => {
    assert.ok(err instanceof CubicleError);
    assert.equal(err.code, "timeout");
    assert.equal(err.status, 0);
    return true;
  });
  await assert.rejects((await c.execStream("abc", { command: "x" })).wait(), ConnectionError);
});

test("config: CUBICLE_URL and CUBICLE_API_KEY are the defaults", async (t) => {
  const s = await standIn(t, (req, res) => json(res, 200, { status: "ok" }));
  const saved = { url: process.env.CUBICLE_URL, key: process.env.CUBICLE_API_KEY };
  t.after(() => {
    for (const [k, v] of [["CUBICLE_URL", saved.url], ["CUBICLE_API_KEY", saved.key]]) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
  process.env.CUBICLE_URL = s.url;
  process.env.CUBICLE_API_KEY = "from-env";
  const c = new Cubicle();
  assert.equal(c.baseUrl, s.url);
  assert.deepEqual(await c.health(), { status: "ok" });
  assert.equal(s.requests[0].headers["x-api-key"], "from-env");
  assert.equal(new Cubicle({ baseUrl: "http://h:1", apiKey: "x" }).baseUrl, "http://h:1");
  assert.throws(() => new Cubicle({ baseUrl: "not a url" }), TypeError);
});

test("stand-in: clipboard, metrics and logs send what the API takes", async (t) => {
  const sample = {
    timestamp: "2025-01-02T03:04:10Z", cpu: { used_seconds: 6.5, percent: 50, count: 2 },
    memory: { used_bytes: 3, cache_bytes: 2, limit_bytes: 4 }, disk: { used_bytes: 5, limit_bytes: 0 },
  };
  const answers = [
    { results: [{ type: "clipboard_get", text: "héllo" }] },
    { results: [{ type: "clipboard_set" }] },
    { sandbox_id: "abc", backend: "gvisor", state: "running", interval_seconds: 5, window_seconds: 600, latest: sample, samples: [sample] },
    { logs: [{ timestamp: "2025-01-02T03:04:06.000000001Z", level: "warn", source: "agent", message: "session: exited", fields: { program: "x11vnc" } }] },
    { logs: [] },
  ];
  const s = await standIn(t, (req, res, n) => {
    if (n > answers.length) return apiError(res, 404, "not_found", "sandbox not found");
    json(res, 200, answers[n - 1]);
  });
  const c = new Cubicle({ baseUrl: s.url, apiKey: "k", retry: { maxRetries: 0 } });
  assert.equal(await c.clipboardGet("abc"), "héllo");
  await c.clipboardSet("abc", "wörld");
  assert.deepEqual(s.requests.slice(0, 2).map((r) => [r.url, JSON.parse(r.body.toString())]), [
    ["/v1/sandboxes/abc/actions", { type: "clipboard_get" }],
    ["/v1/sandboxes/abc/actions", { type: "clipboard_set", text: "wörld" }],
  ]);
  const m = await c.metrics("abc", { since: new Date(Date.UTC(2025, 0, 2, 3, 4, 5, 500)) });
  assert.equal(s.requests[2].url, "/v1/sandboxes/abc/metrics?since=2025-01-02T03%3A04%3A05.500Z");
  assert.equal(m.latest.cpu.percent, 50);
  assert.equal(m.samples.length, 1);
  const logs = await c.logs("abc", { limit: 5, level: "warn", search: "a b" });
  assert.equal(s.requests[3].url, "/v1/sandboxes/abc/logs?limit=5&level=warn&search=a+b");
  assert.deepEqual(logs.map((e) => [e.source, e.message, e.fields.program]), [["agent", "session: exited", "x11vnc"]]);
  assert.deepEqual(await c.logs("abc", { since: logs[0].timestamp }), []);
  assert.equal(s.requests[4].url, "/v1/sandboxes/abc/logs?since=2025-01-02T03%3A04%3A06.000000001Z");
  await assert.rejects(c.logs("abc"), NotFoundError);
});
