"""Unit tests of the SDK's transport against a local stand-in for cubicled
(an http.server that answers scripted statuses): retries, backoff,
Retry-After, the never-retried calls, and the mapping of error bodies to
typed exceptions. They need no daemon."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import unittest
from datetime import datetime, timedelta, timezone
from typing import Any

import cubicle
from cubicle.errors import error_from_response


class StandIn:
    """A stand-in for cubicled: answers each request with the next scripted
    (status, headers, body) and records what it was asked."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, str], bytes]] = []
        self.requests: list[dict[str, Any]] = []
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                standin.requests.append(
                    {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
                )
                status, headers, out = standin.script.pop(0) if standin.script else (500, {}, b"")
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def err(status: int, code: str, msg: str = "m", **extra: Any) -> tuple[int, dict[str, str], bytes]:
    e: dict[str, Any] = {"code": code, "message": msg, **extra}
    return status, {"Content-Type": "application/json"}, json.dumps({"error": e}).encode()


def ok(doc: Any, status: int = 200) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()


SANDBOX = {"id": "abc123", "state": "running", "resolution": {"width": 1024, "height": 768},
           "created_at": "2026-01-02T03:04:05.123456789Z", "metadata": {"k": "v"}}


class RetryTest(unittest.TestCase):
    def setUp(self) -> None:
        self.standin = StandIn()
        self.addCleanup(self.standin.close)
        self.sleeps: list[float] = []
        self.c = cubicle.Client(self.standin.url, "k3y", max_retries=3, retry_backoff=0.01, timeout=10)
        real_sleep = self.c._t.sleep

        def sleep(d: float) -> None:
            self.sleeps.append(d)
            real_sleep(d)

        self.c._t.sleep = sleep

    def test_get_retried_after_503(self) -> None:
        self.standin.script = [err(503, "unavailable"), ok(SANDBOX)]
        sb = self.c.get("abc123")
        self.assertEqual(sb.id, "abc123")
        self.assertEqual(sb.resolution, cubicle.Resolution(1024, 768))
        self.assertIsNotNone(sb.created_at)
        self.assertEqual(len(self.standin.requests), 2)
        self.assertEqual(len(self.sleeps), 1)
        self.assertEqual(self.standin.requests[0]["headers"].get("X-API-Key"), "k3y")

    def test_502_504_then_ok(self) -> None:
        self.standin.script = [(502, {}, b"bad gateway"), err(504, "timeout"), ok({"sandboxes": [SANDBOX]})]
        self.assertEqual([s.id for s in self.c.list(state="running", metadata={"k": "v"})], ["abc123"])
        self.assertEqual(len(self.standin.requests), 3)
        q = self.standin.requests[-1]["path"]
        self.assertIn("state=running", q)
        self.assertIn("metadata.k=v", q)
        # Exponential: the second wait's range lies above the first's.
        self.assertLessEqual(self.sleeps[0], 0.01)
        self.assertGreaterEqual(self.sleeps[1], 0.01)

    def test_429_honours_retry_after(self) -> None:
        status, headers, body = err(429, "rate_limited", "slow down")
        self.standin.script = [(status, {**headers, "Retry-After": "1"}, body), ok({"entries": []})]
        t = time.monotonic()
        self.assertEqual(self.c.list_files("abc123", "/tmp"), [])
        self.assertGreaterEqual(time.monotonic() - t, 1.0)
        self.assertEqual(len(self.standin.requests), 2)
        self.assertGreaterEqual(self.sleeps[0], 1.0)

    def test_retries_are_bounded(self) -> None:
        self.standin.script = [err(503, "unavailable", "busy")] * 10
        with self.assertRaises(cubicle.UnavailableError) as cm:
            self.c.delete_file("abc123", "/tmp/x")
        self.assertEqual(cm.exception.status, 503)
        self.assertEqual(len(self.standin.requests), 4)  # 1 + max_retries

    def test_put_file_resends_body(self) -> None:
        data = bytes(range(256))
        self.standin.script = [err(503, "unavailable"), ok({"path": "/tmp/b", "size": 256})]
        info = self.c.put_file("abc123", "/tmp/b", data)
        self.assertEqual(info, cubicle.FileInfo("/tmp/b", 256))
        self.assertEqual([r["body"] for r in self.standin.requests], [data, data])
        self.assertEqual(self.standin.requests[0]["method"], "PUT")

    def test_post_create_and_exec_never_retried(self) -> None:
        for call in (lambda: self.c.create(), lambda: self.c.exec("abc123", "true"),
                     lambda: self.c.actions("abc123", {"type": "move", "x": 1, "y": 1})):
            self.standin.requests.clear()
            self.standin.script = [err(503, "unavailable"), ok(SANDBOX)]
            with self.assertRaises(cubicle.UnavailableError):
                call()
            self.assertEqual(len(self.standin.requests), 1)
        self.assertEqual(self.sleeps, [])

    def test_no_retry_on_client_errors(self) -> None:
        self.standin.script = [err(404, "not_found", "sandbox not found"), ok(SANDBOX)]
        with self.assertRaises(cubicle.NotFoundError):
            self.c.get("abc123")
        self.assertEqual(len(self.standin.requests), 1)

    def test_retries_off(self) -> None:
        c = cubicle.Client(self.standin.url, "k", max_retries=0)
        self.standin.script = [err(503, "unavailable"), ok(SANDBOX)]
        with self.assertRaises(cubicle.UnavailableError):
            c.get("abc123")
        self.assertEqual(len(self.standin.requests), 1)

    def test_connection_refused_is_retried_then_raised(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        c = cubicle.Client(f"http://127.0.0.1:{port}", "k", max_retries=2, retry_backoff=0.01)
        with self.assertRaises(cubicle.CubicleConnectionError) as cm:
            c.info()
        self.assertEqual(cm.exception.status, 0)
        self.assertIsInstance(cm.exception.__cause__, OSError)

    def test_exec_stream_lines(self) -> None:
        lines = [{"stdout": "a"}, {"stderr": "b"}, {"truncated": True}, {"exit_code": 4, "duration_ms": 9}]
        ndjson = "".join(json.dumps(x) + "\n" for x in lines).encode()
        self.standin.script = [(200, {"Content-Type": "application/x-ndjson"}, ndjson)]
        with self.c.exec_stream("abc123", "x") as s:
            evs = list(s)
        self.assertEqual([(e.stdout, e.stderr) for e in evs[:2]], [("a", ""), ("", "b")])
        self.assertEqual((s.exit_code, s.truncated, s.duration_ms), (4, True, 9))
        self.assertEqual(self.standin.requests[0]["headers"].get("Accept"), "application/x-ndjson")

        # An error after the 200 ends the stream with its typed error.
        ndjson = b'{"stdout": "a"}\n{"error": {"code": "unavailable", "message": "agent went away"}}\n'
        self.standin.script = [(200, {}, ndjson)]
        with self.assertRaises(cubicle.UnavailableError) as cm:
            self.c.exec_stream("abc123", "x").wait()
        self.assertEqual((cm.exception.status, cm.exception.message), (0, "agent went away"))

        # A stream cut before the exit code.
        self.standin.script = [(200, {}, b'{"stdout": "a"}\n')]
        with self.assertRaises(cubicle.StreamEndedError):
            self.c.exec_stream("abc123", "x").wait()


class ErrorMappingTest(unittest.TestCase):
    def test_codes_map_to_classes(self) -> None:
        cases = {
            (401, "unauthorized"): cubicle.UnauthorizedError,
            (403, "permission_denied"): cubicle.PermissionDeniedError,
            (404, "not_found"): cubicle.NotFoundError,
            (400, "invalid_argument"): cubicle.InvalidArgumentError,
            (409, "conflict"): cubicle.ConflictError,
            (409, "no_desktop"): cubicle.NoDesktopError,
            (409, "not_supported"): cubicle.NotSupportedError,
            (413, "payload_too_large"): cubicle.PayloadTooLargeError,
            (429, "capacity_exhausted"): cubicle.CapacityExhaustedError,
            (503, "capacity_exhausted"): cubicle.CapacityExhaustedError,
            (429, "rate_limited"): cubicle.RateLimitedError,
            (504, "timeout"): cubicle.CubicleTimeoutError,
            (503, "unavailable"): cubicle.UnavailableError,
            (500, "internal"): cubicle.InternalError,
        }
        for (status, code), cls in cases.items():
            e = error_from_response(status, {}, err(status, code, "msg")[2])
            self.assertIs(type(e), cls, code)
            self.assertIsInstance(e, cubicle.CubicleError)
            self.assertEqual((e.status, e.code, e.message), (status, code, "msg"))

    def test_action_index_and_results(self) -> None:
        body = json.dumps({"error": {"code": "invalid_argument", "message": "bad", "index": 2},
                           "results": [{"type": "move"}, {"type": "move"}]}).encode()
        e = error_from_response(400, {}, body)
        self.assertIsInstance(e, cubicle.InvalidArgumentError)
        self.assertEqual(e.index, 2)
        self.assertEqual(len(e.results or []), 2)
        self.assertEqual((e.body or {}).get("results"), e.results)
        self.assertTrue(str(e).startswith("action 2: bad ("), str(e))
        e = error_from_response(400, {}, err(400, "invalid_argument", "action 1: nope", index=1)[2])
        self.assertEqual(str(e), "action 1: nope (invalid_argument, HTTP 400)")

    def test_unknown_code_and_no_body(self) -> None:
        e = error_from_response(507, {}, err(507, "insufficient_storage")[2])
        self.assertIs(type(e), cubicle.CubicleError)
        self.assertEqual(e.code, "insufficient_storage")
        e = error_from_response(404, {}, b"<html>nope</html>")
        self.assertIsInstance(e, cubicle.NotFoundError)
        self.assertEqual(e.code, "not_found")
        e = error_from_response(418, {"Retry-After": "3"}, err(418, "new_code")[2])
        self.assertIs(type(e), cubicle.CubicleError)
        self.assertEqual(e.retry_after, 3.0)


class ConfigTest(unittest.TestCase):
    def test_env_defaults(self) -> None:
        import os
        from unittest import mock

        with mock.patch.dict(os.environ, {"CUBICLE_URL": "http://h.example:9/", "CUBICLE_API_KEY": "ek"}):
            c = cubicle.Client()
        self.assertEqual(c.base_url, "http://h.example:9")
        self.assertEqual(c._t.api_key, "ek")
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertEqual(cubicle.Client().base_url, cubicle.DEFAULT_URL)
        with self.assertRaises(ValueError):
            cubicle.Client("not a url")

    def test_exec_needs_command_or_argv(self) -> None:
        c = cubicle.Client("http://127.0.0.1:1")
        with self.assertRaises(ValueError):
            c.exec("abc")
        with self.assertRaises(ValueError):
            c.get("")


class ClipboardMetricsLogsTest(unittest.TestCase):
    """The request each call sends and how its answer is read."""

    def setUp(self) -> None:
        self.standin = StandIn()
        self.addCleanup(self.standin.close)
        self.c = cubicle.Client(self.standin.url, "k3y", max_retries=0, timeout=10)

    def test_clipboard(self) -> None:
        self.standin.script = [ok({"results": [{"type": "clipboard_get", "text": "héllo"}]}),
                               ok({"results": [{"type": "clipboard_set"}]})]
        self.assertEqual(self.c.clipboard_get("abc123"), "héllo")
        self.c.clipboard_set("abc123", "wörld")
        bodies = [json.loads(r["body"]) for r in self.standin.requests]
        self.assertEqual(bodies, [{"actions": [{"type": "clipboard_get"}]},
                                  {"actions": [{"type": "clipboard_set", "text": "wörld"}]}])
        self.assertEqual({r["path"] for r in self.standin.requests}, {"/v1/sandboxes/abc123/actions"})

    def test_metrics(self) -> None:
        sample = {"timestamp": "2025-01-02T03:04:10Z", "cpu": {"used_seconds": 6.5, "percent": 50, "count": 2},
                  "memory": {"used_bytes": 3, "cache_bytes": 2, "limit_bytes": 4},
                  "disk": {"used_bytes": 5, "limit_bytes": 0},
                  "network": {"rx_bytes": 10, "tx_bytes": 20, "rx_packets": 1, "tx_packets": 2}}
        self.standin.script = [ok({"sandbox_id": "abc123", "backend": "gvisor", "state": "running",
                                   "interval_seconds": 5, "window_seconds": 600, "latest": sample,
                                   "samples": [sample]}),
                               ok({"sandbox_id": "abc123", "latest": None, "samples": []})]
        since = datetime(2025, 1, 2, 4, 4, 5, 500000, tzinfo=timezone(timedelta(hours=1)))
        m = self.c.metrics("abc123", since=since)
        self.assertEqual(self.standin.requests[0]["path"],
                         "/v1/sandboxes/abc123/metrics?since=2025-01-02T03%3A04%3A05.500000Z")
        self.assertIsNotNone(m.latest)
        assert m.latest is not None
        self.assertEqual((m.latest.cores_used, m.latest.memory_used_bytes, m.latest.disk_limit_bytes),
                         (1.0, 3, 0))
        self.assertEqual(m.latest.network, {"rx_bytes": 10, "tx_bytes": 20, "rx_packets": 1, "tx_packets": 2})
        self.assertEqual((m.interval_seconds, len(m.samples)), (5.0, 1))
        m = self.c.metrics("abc123")
        self.assertEqual(self.standin.requests[1]["path"], "/v1/sandboxes/abc123/metrics")
        self.assertIsNone(m.latest)
        with self.assertRaises(ValueError):
            self.c.metrics("abc123", since=datetime(2025, 1, 2))

    def test_logs(self) -> None:
        self.standin.script = [ok({"logs": [
            {"timestamp": "2025-01-02T03:04:06.000000001Z", "level": "warn", "source": "agent",
             "message": "session: exited", "fields": {"program": "x11vnc"}},
            {"timestamp": "2025-01-02T03:04:07Z", "level": "info", "source": "console", "message": "hello"}]}),
            ok({"logs": []}), err(404, "not_found", "sandbox not found")]
        logs = self.c.logs("abc123", limit=5, level="warn", search="a b")
        self.assertEqual(self.standin.requests[0]["path"],
                         "/v1/sandboxes/abc123/logs?limit=5&level=warn&search=a+b")
        self.assertEqual([(e.source, e.level, e.message) for e in logs],
                         [("agent", "warn", "session: exited"), ("console", "info", "hello")])
        self.assertEqual(logs[0].fields, {"program": "x11vnc"})
        self.assertEqual(logs[0].raw_timestamp, "2025-01-02T03:04:06.000000001Z")
        self.assertEqual(logs[1].timestamp, datetime(2025, 1, 2, 3, 4, 7, tzinfo=timezone.utc))
        self.assertEqual(self.c.logs("abc123", since=logs[0].raw_timestamp), [])
        self.assertEqual(self.standin.requests[1]["path"],
                         "/v1/sandboxes/abc123/logs?since=2025-01-02T03%3A04%3A06.000000001Z")
        with self.assertRaises(cubicle.NotFoundError):
            self.c.logs("abc123")


if __name__ == "__main__":
    unittest.main()
