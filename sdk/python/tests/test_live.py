"""End-to-end tests of the SDK against a real cubicled (CUBICLE_URL and
CUBICLE_API_KEY; test/e2e/sdk_python_test.go starts one on gvisor and runs
this suite). They make two sandboxes: a desktop most tests share, and one
for the lifecycle (create without waiting, pause, resume, destroy).

Without CUBICLE_URL they skip, unless CUBICLE_REQUIRE_E2E=1, which makes
that a failure."""

from __future__ import annotations

import base64
import os
import secrets
import struct
import time
import unittest
from datetime import datetime, timedelta, timezone

import cubicle

WIDTH, HEIGHT = 1024, 768
#: The daemon's default backend, which the sandboxes get (the Go wrapper
#: says which).
BACKEND = os.environ.get("CUBICLE_TEST_BACKEND", "gvisor")
ISOLATION = {"gvisor": "gvisor", "runc": "namespace"}.get(BACKEND, "vm")


def setUpModule() -> None:
    if not os.environ.get("CUBICLE_URL"):
        msg = "needs a running cubicled: set CUBICLE_URL and CUBICLE_API_KEY"
        if os.environ.get("CUBICLE_REQUIRE_E2E") == "1":
            raise RuntimeError(msg + " (CUBICLE_REQUIRE_E2E=1 forbids skipping)")
        raise unittest.SkipTest(msg)


def png_size(data: bytes) -> tuple[int, int]:
    """Returns the width and height of a PNG from its IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise AssertionError(f"not a PNG: {data[:16]!r}")
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def eventually(what: str, cond: "callable[[], bool]", timeout: float = 20.0) -> None:  # type: ignore[valid-type]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class DesktopTest(unittest.TestCase):
    """Tests on one shared desktop sandbox."""

    c: cubicle.Client
    sb: cubicle.Sandbox
    run_id: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.c = cubicle.Client()
        cls.run_id = secrets.token_hex(4)
        cls.sb = cls.c.create(
            resolution=(WIDTH, HEIGHT),
            metadata={"suite": "sdk-python", "run": cls.run_id},
            timeout_seconds=600,
            idle_timeout_seconds=300,
            network="none",
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.c.destroy(cls.sb.id)

    def test_created(self) -> None:
        sb = self.sb
        self.assertEqual(sb.state, "running")
        self.assertRegex(sb.id, r"^[a-z0-9]+$")
        self.assertEqual(sb.resolution, cubicle.Resolution(WIDTH, HEIGHT))
        self.assertEqual(sb.backend, BACKEND)
        self.assertEqual(sb.isolation, ISOLATION)
        self.assertEqual(sb.metadata["run"], self.run_id)
        self.assertIsInstance(sb.created_at, datetime)

    def test_health_and_info(self) -> None:
        self.assertEqual(self.c.health()["status"], "ok")
        info = self.c.info()
        self.assertTrue(info.version)
        self.assertIn(BACKEND, [b.name for b in info.backends if b.available])
        self.assertGreaterEqual(info.capacity.running, 1)
        # gvisor and runc name the program they run, with its version.
        for b in info.backends:
            if b.name in ("gvisor", "runc") and b.available:
                self.assertIsNotNone(b.runtime, b)
                self.assertEqual(b.runtime.name, {"gvisor": "runsc", "runc": "runc"}[b.name])
                self.assertTrue(b.runtime.version, b.runtime)

    def test_get_and_list_filters(self) -> None:
        got = self.c.get(self.sb.id)
        self.assertEqual((got.id, got.state), (self.sb.id, "running"))
        ids = [s.id for s in self.c.list(state="running", metadata={"run": self.run_id})]
        self.assertEqual(ids, [self.sb.id])
        self.assertEqual(self.c.list(metadata={"run": "not-" + self.run_id}), [])
        self.assertNotIn(self.sb.id, [s.id for s in self.c.list(state="stopped")])

    def test_screenshot(self) -> None:
        png = self.c.screenshot(self.sb.id)
        self.assertEqual(png_size(png), (WIDTH, HEIGHT))
        small = self.c.screenshot(self.sb.id, width=512)
        self.assertEqual(png_size(small), (512, 384))
        jpeg = self.c.screenshot(self.sb.id, format="jpeg", quality=50, region=(0, 0, 200, 100))
        self.assertEqual(jpeg[:3], b"\xff\xd8\xff")

    def test_move_and_cursor(self) -> None:
        self.c.move(self.sb.id, 123, 234)
        self.assertEqual(self.c.cursor_position(self.sb.id), (123, 234))
        out = self.c.exec(self.sb.id, "xdotool getmouselocation")
        self.assertEqual(out.exit_code, 0, out.stderr)
        self.assertIn("x:123 y:234", out.stdout)

    def test_click_and_type(self) -> None:
        # xev prints the key events its window gets: click into it, type,
        # and read what it saw.
        log = "/tmp/sdk-xev.log"
        self.c.exec_background(self.sb.id, f"xev -event keyboard -geometry 400x300+50+50 > {log} 2>&1")
        eventually("xev's window", lambda: any(w.get("title") == "Event Tester" for w in self.c.windows(self.sb.id)))
        self.c.click(self.sb.id, 250, 200)
        self.c.type(self.sb.id, "qz")
        self.c.key(self.sb.id, "Return")

        def saw_keys() -> bool:
            text = self.c.get_file(self.sb.id, log).decode()
            return all(k in text for k in ("(keysym 0x71, q)", "(keysym 0x7a, z)", "Return)"))

        eventually("the typed keys in xev's output", saw_keys, timeout=10)
        self.c.exec(self.sb.id, "pkill -x xev")

    def test_actions_list(self) -> None:
        res = self.c.actions(
            self.sb.id,
            [
                {"type": "move", "x": 10, "y": 20},
                {"type": "cursor_position"},
                {"type": "screen_size"},
                {"type": "screenshot", "scale": 0.5},
            ],
        )
        self.assertEqual([r["type"] for r in res.results], ["move", "cursor_position", "screen_size", "screenshot"])
        self.assertEqual((res.results[1]["x"], res.results[1]["y"]), (10, 20))
        self.assertEqual(self.c.screen_size(self.sb.id), cubicle.Resolution(WIDTH, HEIGHT))
        (shot,) = res.screenshots()
        self.assertEqual(png_size(shot), (WIDTH // 2, HEIGHT // 2))
        # A single action object is sent as is.
        one = self.c.actions(self.sb.id, {"type": "cursor_position"})
        self.assertEqual((one.results[0]["x"], one.results[0]["y"]), (10, 20))

    def test_exec_plain(self) -> None:
        r = self.c.exec(self.sb.id, "echo héllo; echo oops >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (3, "héllo\n", "oops\n"))
        r = self.c.exec(self.sb.id, argv=["sh", "-c", 'echo "$A-$PWD"; cat'], env={"A": "x"}, cwd="/tmp", stdin="in")
        self.assertEqual((r.exit_code, r.stdout), (0, "x-/tmp\nin"))

    def test_exec_stream(self) -> None:
        start = time.monotonic()
        first = None
        out, err = [], []
        with self.c.exec_stream(self.sb.id, "echo one; sleep 1; echo two; echo bad >&2; exit 7") as s:
            for ev in s:
                if first is None:
                    first = time.monotonic() - start
                out.append(ev.stdout)
                err.append(ev.stderr)
        total = time.monotonic() - start
        self.assertEqual(s.exit_code, 7)
        self.assertEqual("".join(out), "one\ntwo\n")
        self.assertEqual("".join(err), "bad\n")
        # The first line came while the command still ran.
        assert first is not None
        self.assertLess(first, total - 0.5)
        self.assertEqual(self.c.exec_stream(self.sb.id, argv=["true"]).wait(), 0)

    def test_files_round_trip(self) -> None:
        data = bytes(range(256)) * 64 + "ünïcode".encode()
        info = self.c.put_file(self.sb.id, "/tmp/sdk/dir/blob.bin", data)
        self.assertEqual(info.size, len(data))
        self.assertEqual(self.c.get_file(self.sb.id, "/tmp/sdk/dir/blob.bin"), data)
        self.c.put_file(self.sb.id, "/tmp/sdk/dir/note.txt", "hi")
        entries = {e.name: e for e in self.c.list_files(self.sb.id, "/tmp/sdk/dir")}
        self.assertEqual(set(entries), {"blob.bin", "note.txt"})
        self.assertEqual((entries["blob.bin"].type, entries["blob.bin"].size), ("file", len(data)))
        self.assertEqual(entries["blob.bin"].path, "/tmp/sdk/dir/blob.bin")
        self.c.delete_file(self.sb.id, "/tmp/sdk/dir/blob.bin")
        with self.assertRaises(cubicle.NotFoundError) as cm:
            self.c.get_file(self.sb.id, "/tmp/sdk/dir/blob.bin")
        self.assertEqual(cm.exception.status, 404)

    def test_errors(self) -> None:
        with self.assertRaises(cubicle.NotFoundError) as nf:
            self.c.get("nosuchsandbox0000")
        self.assertEqual((nf.exception.status, nf.exception.code), (404, "not_found"))

        with self.assertRaises(cubicle.InvalidArgumentError) as bad:
            self.c.actions(self.sb.id, [{"type": "move", "x": 1, "y": 1}, {"type": "no_such_action"}])
        self.assertEqual((bad.exception.status, bad.exception.code, bad.exception.index), (400, "invalid_argument", 1))

        with self.assertRaises(cubicle.InvalidArgumentError) as off:
            self.c.actions(self.sb.id, [{"type": "move", "x": 5, "y": 5}, {"type": "click", "x": WIDTH + 500, "y": 5}])
        self.assertEqual(off.exception.index, 1)
        self.assertEqual([r["type"] for r in off.exception.results or []], ["move"])  # the ones that ran

        wrong = cubicle.Client(api_key="wrong-" + secrets.token_hex(8))
        with self.assertRaises(cubicle.UnauthorizedError) as ua:
            wrong.list()
        self.assertEqual((ua.exception.status, ua.exception.code), (401, "unauthorized"))
        self.assertEqual(wrong.health()["status"], "ok")  # no key needed

        if BACKEND == "runc":
            # runc does not fork (README: it answers 409 not_supported).
            with self.assertRaises(cubicle.NotSupportedError):
                self.c.fork(self.sb.id, 1)

    def test_fork_and_snapshot(self) -> None:
        if BACKEND == "runc":
            self.skipTest("runc does not copy (test_errors)")
        self.c.exec(self.sb.id, command="echo " + self.run_id + " > ~/sdk-copy")
        (f,) = self.c.fork(self.sb.id, 1)
        try:
            self.assertEqual(f.state, "running")
            self.assertNotEqual(f.id, self.sb.id)
            self.assertEqual(self.c.exec(f.id, command="cat ~/sdk-copy").stdout, self.run_id + "\n")
        finally:
            self.c.destroy(f.id)
        snap = self.c.create_snapshot(self.sb.id, name="py-" + self.run_id)
        try:
            c = self.c.create(from_snapshot=snap.id)
            try:
                self.assertEqual(self.c.exec(c.id, command="cat ~/sdk-copy").stdout, self.run_id + "\n")
            finally:
                self.c.destroy(c.id)
        finally:
            self.c.delete_snapshot(snap.id)

    def test_timeout_and_view(self) -> None:
        sb = self.c.set_timeout(self.sb.id, 1200)
        assert sb.expires_at is not None
        want = datetime.now(timezone.utc) + timedelta(seconds=1200)
        self.assertLess(abs((sb.expires_at - want).total_seconds()), 60)
        v = self.c.view(self.sb.id, ttl_seconds=60)
        self.assertIn(f"/view/{self.sb.id}?token=", v.url)
        self.assertTrue(v.view_only)
        assert v.expires_at is not None
        self.assertGreater(v.expires_at, datetime.now(timezone.utc))

    def test_vendor_computer_use(self) -> None:
        # The screen is 1024×768; a 512×384 display halves it.
        tool = {"type": "computer_20251124", "name": "computer", "display_width_px": 512, "display_height_px": 384}
        shot = self.c.computer_anthropic(self.sb.id, {"tool": tool, "input": {"action": "screenshot"}})
        self.assertEqual((shot["type"], shot["is_error"]), ("tool_result", False))
        src = shot["content"][0]["source"]
        self.assertEqual(src["media_type"], "image/png")
        self.assertEqual(png_size(base64.b64decode(src["data"])), (512, 384))
        self.c.computer_anthropic(self.sb.id, {"tool": tool, "input": {"action": "mouse_move", "coordinate": [100, 50]}})
        self.assertEqual(self.c.cursor_position(self.sb.id), (201, 101))
        cur = self.c.computer_anthropic(self.sb.id, {"tool": tool, "input": {"action": "cursor_position"}})
        self.assertEqual(cur["content"][0]["text"], "X=100,Y=50")
        with self.assertRaises(cubicle.InvalidArgumentError) as cm:
            self.c.computer_anthropic(self.sb.id, {"tool": tool, "input": {"action": "left_click", "coordinate": [600, 10]}})
        self.assertIn("outside the screen", cm.exception.message)
        self.assertTrue(cm.exception.body["tool_result"]["is_error"])
        out = self.c.computer_openai(self.sb.id, {"computer_call": {
            "type": "computer_call", "call_id": "call_1", "pending_safety_checks": [],
            "action": {"type": "move", "x": 300, "y": 200}}})
        self.assertEqual((out["type"], out["call_id"]), ("computer_call_output", "call_1"))
        self.assertTrue(out["output"]["image_url"].startswith("data:image/png;base64,"))
        self.assertEqual(self.c.cursor_position(self.sb.id), (300, 200))

    def test_volumes_and_snapshots(self) -> None:
        name = "sdk-py-" + self.run_id
        vol = self.c.create_volume(name, 64)
        try:
            self.assertEqual((vol.name, vol.size_mb), (name, 64))
            self.assertEqual(self.c.get_volume(name).name, name)
            self.assertIn(name, [v.name for v in self.c.list_volumes()])
        finally:
            self.c.delete_volume(name)
        with self.assertRaises(cubicle.NotFoundError):
            self.c.get_volume(name)
        with self.assertRaises(cubicle.NotFoundError):
            self.c.get_snapshot("no-such-snapshot")
        self.assertEqual(self.c.list_snapshots(self.sb.id), [])

    def test_clipboard(self) -> None:
        text = "cubicle clipboard ✓ " + self.run_id
        self.c.clipboard_set(self.sb.id, text)
        self.assertEqual(self.c.clipboard_get(self.sb.id), text)
        self.c.clipboard_set(self.sb.id, "Grüße 東京 😀")
        self.assertEqual(self.c.clipboard_get(self.sb.id), "Grüße 東京 😀")

    def test_metrics(self) -> None:
        m = self.c.metrics(self.sb.id)
        self.assertEqual((m.sandbox_id, m.backend, m.state), (self.sb.id, BACKEND, "running"))
        self.assertGreater(m.interval_seconds, 0)
        # The first sample comes one interval after the start (5 s by
        # default; TestPythonSDK's daemon samples every second).
        latest: list[cubicle.MetricsSample] = []

        def sampled() -> bool:
            got = self.c.metrics(self.sb.id).latest
            if got is not None:
                latest.append(got)
            return got is not None

        eventually("a metrics sample", sampled, timeout=30)
        s = latest[-1]
        self.assertGreater(s.memory_used_bytes, 0)
        self.assertGreater(s.cpu_count, 0)
        self.assertTrue(0 <= s.cpu_percent <= 100, s.cpu_percent)
        assert s.timestamp is not None
        later = self.c.metrics(self.sb.id, since=s.timestamp + timedelta(hours=1))
        self.assertEqual(later.samples, [])

    def test_logs(self) -> None:
        # The agent logs the session's programs as they start.
        logs = self.c.logs(self.sb.id)
        self.assertTrue(any(e.source == "agent" and e.message == "session: started" and e.fields.get("program")
                            for e in logs), [(e.source, e.message) for e in logs[:20]])
        # What a program prints on the agent's stdout reaches the log (a
        # root process in the sandbox may write there).
        marker = "cubicle-sdk-python-log-" + self.run_id
        last = logs[-1].raw_timestamp if logs else None
        r = self.c.exec(self.sb.id, f"echo {marker} > /proc/1/fd/1")
        self.assertEqual(r.exit_code, 0, r.stderr)
        found: list[cubicle.LogEntry] = []

        def printed() -> bool:
            found[:] = [e for e in self.c.logs(self.sb.id, since=last, search=marker)]
            return bool(found)

        eventually("the marker in the logs", printed)
        self.assertEqual((found[0].source, found[0].level, found[0].message), ("console", "info", marker))
        self.assertEqual(self.c.logs(self.sb.id, since=found[0].raw_timestamp, search=marker), [])
        self.assertEqual(len(self.c.logs(self.sb.id, limit=1)), 1)
        with self.assertRaises(cubicle.InvalidArgumentError):
            self.c.logs(self.sb.id, level="loud")


class LifecycleTest(unittest.TestCase):
    """A second sandbox: created without waiting, paused and resumed where
    the backend can, destroyed."""

    def test_lifecycle(self) -> None:
        c = cubicle.Client()
        sb = c.create(wait=False, metadata={"suite": "sdk-python-lifecycle"}, timeout_seconds=300)
        try:
            self.assertIn(sb.state, ("starting", "running"))
            eventually("the sandbox to run", lambda: c.get(sb.id).state == "running", timeout=60)

            caps = {b.name: b.capabilities for b in c.info().backends}
            if caps.get(sb.backend or BACKEND, cubicle.Capabilities()).pause:
                c.put_file(sb.id, "/root/kept.txt", "before pause")
                paused = c.pause(sb.id)
                self.assertEqual(paused.state, "paused")
                self.assertEqual([s.id for s in c.list(state="paused")], [sb.id])
                with self.assertRaises(cubicle.ConflictError):
                    c.exec(sb.id, "true")
                resumed = c.resume(sb.id)
                self.assertEqual(resumed.state, "running")
                self.assertEqual(c.get_file(sb.id, "/root/kept.txt"), b"before pause")
            else:
                with self.assertRaises(cubicle.NotSupportedError):
                    c.pause(sb.id)
        finally:
            c.destroy(sb.id)
        gone = c.get(sb.id)
        self.assertEqual(gone.state, "stopped")
        c.destroy(sb.id)  # again: a retried destroy succeeds
        with self.assertRaises(cubicle.ConflictError):
            c.exec(sb.id, "true")


if __name__ == "__main__":
    unittest.main()
