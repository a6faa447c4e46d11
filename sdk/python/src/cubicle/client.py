"""The cubicle client: typed methods for cubicled's native REST API."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.parse
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping, Sequence

from . import __version__ as _version
from ._transport import DEFAULT, Query, Response, RetryPolicy, Transport
from .errors import CubicleError, StreamEndedError, error_class
from .models import (
    ActionsResult,
    ExecEvent,
    ExecResult,
    FileEntry,
    FileInfo,
    Info,
    LogEntry,
    Metrics,
    Network,
    Resolution,
    Sandbox,
    Snapshot,
    View,
    Volume,
    VolumeMount,
)

__all__ = ["Client", "ExecStream", "DEFAULT_URL"]

#: The daemon's default listen address, used without base_url or CUBICLE_URL.
DEFAULT_URL = "http://127.0.0.1:7171"

Action = Mapping[str, Any]


def _sandbox_path(sandbox_id: str, *sub: str) -> str:
    if not sandbox_id:
        # An empty id would address a different endpoint.
        raise ValueError("cubicle: empty sandbox id")
    return "/v1/sandboxes/" + urllib.parse.quote(sandbox_id, safe="") + "".join("/" + s for s in sub)


def _name_path(kind: str, name: str) -> str:
    if not name:
        raise ValueError(f"cubicle: empty {kind[:-1]} name")
    return f"/v1/{kind}/" + urllib.parse.quote(name, safe="")


def _rfc3339(t: datetime | str) -> str:
    """A time for a query: strings as they are (a raw_timestamp keeps its
    nanoseconds), datetimes in UTC (naive ones are refused: their zone is
    a guess)."""
    if isinstance(t, str):
        return t
    if t.tzinfo is None:
        raise ValueError("since must be a timezone-aware datetime")
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _str_of(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _network(n: Network | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(n, str):
        return {"egress": n}
    if "egress" in n:
        return dict(n)
    return {"egress": dict(n)}


def _volume(v: VolumeMount | tuple[str, str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(v, VolumeMount):
        return v.to_dict()
    if isinstance(v, tuple):
        return {"name": v[0], "path": v[1]}
    return dict(v)


class ExecStream:
    """A command whose output streams as it runs. Iterate it for
    :class:`ExecEvent` items (stdout and stderr chunks, a truncation
    notice, and last the exit code); afterwards ``exit_code`` holds it.
    ``wait()`` consumes the rest and returns the exit code. Close it, or use
    it as a context manager, to abandon the command's output early.

    An error the daemon reports after the stream started raises its typed
    CubicleError (status 0); a stream cut before the exit code raises
    StreamEndedError."""

    def __init__(self, resp: Response) -> None:
        self._resp = resp
        self.exit_code: int | None = None
        self.timed_out = False
        self.truncated = False
        self.duration_ms = 0
        self._done = False

    def __iter__(self) -> Iterator[ExecEvent]:
        return self._events()

    def _events(self) -> Iterator[ExecEvent]:
        if self._done:
            return
        try:
            while True:
                try:
                    line = self._resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise StreamEndedError(0, StreamEndedError.default_code, f"exec stream: {e!r}") from e
                if not line:
                    raise StreamEndedError(
                        0, StreamEndedError.default_code, "exec stream ended without an exit code"
                    )
                line = line.strip()
                if not line:
                    continue
                try:
                    doc = json.loads(line)
                except ValueError as e:
                    raise CubicleError(0, "bad_answer", f"exec stream: bad line {line[:100]!r}") from e
                if not isinstance(doc, dict):
                    raise CubicleError(0, "bad_answer", f"exec stream: bad line {line[:100]!r}")
                err = doc.get("error")
                if isinstance(err, dict):
                    code = str(err.get("code") or "internal")
                    raise error_class(code, 0)(0, code, str(err.get("message") or ""))
                ev = ExecEvent.from_dict(doc)
                self.truncated = self.truncated or ev.truncated
                if ev.exit_code is not None:
                    self.exit_code = ev.exit_code
                    self.timed_out = ev.timed_out
                    self.duration_ms = ev.duration_ms
                    self._done = True
                    yield ev
                    return
                yield ev
        finally:
            self._done = True
            self.close()

    def wait(self) -> int:
        """Reads the rest of the output and returns the exit code."""
        for _ in self:
            pass
        if self.exit_code is None:
            raise StreamEndedError(0, StreamEndedError.default_code, "exec stream already closed")
        return self.exit_code

    def close(self) -> None:
        """Abandons the stream (the connection is closed)."""
        self._resp.close()

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client:
    """Talks to one cubicled. Safe for concurrent use from several threads.

    Args:
        base_url: the daemon, e.g. ``"http://127.0.0.1:7171"`` (a path
            prefix is kept). Default: env ``CUBICLE_URL``, else
            :data:`DEFAULT_URL`.
        api_key: sent as ``X-API-Key``. Default: env ``CUBICLE_API_KEY``.
        timeout: socket timeout of each request in seconds (each connect
            and each read, not the whole call; None: none). Creates wait
            for the desktop to boot, so keep it generous. Streamed exec
            output is read without one.
        max_retries: extra attempts of idempotent calls (GET, file PUT,
            DELETE, set_timeout) after a connection failure or a 429, 502,
            503 or 504. 0 turns retries off. Creates, exec, actions and
            other POSTs are never retried.
        retry_backoff: the first wait between attempts; it doubles each
            time (with jitter), each wait capped at max_backoff, and
            stretched to a Retry-After the daemon sends (capped likewise).
        ssl_context: for https base URLs with a custom CA.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = 300.0,
        max_retries: int = 3,
        retry_backoff: float = 0.2,
        max_backoff: float = 10.0,
        user_agent: str = f"cubicle-python/{_version}",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if base_url is None:
            base_url = os.environ.get("CUBICLE_URL") or DEFAULT_URL
        if api_key is None:
            api_key = os.environ.get("CUBICLE_API_KEY") or None
        self._t = Transport(
            base_url,
            api_key,
            timeout=timeout,
            retry=RetryPolicy(max(0, max_retries), retry_backoff, max_backoff),
            user_agent=user_agent,
            ssl_context=ssl_context,
        )

    @property
    def base_url(self) -> str:
        """The daemon address the client talks to."""
        return self._t.base_url

    def _json(self, method: str, path: str, payload: Any = None, **kw: Any) -> Any:
        return self._t.json(method, path, payload, **kw)

    # Service.

    def health(self) -> dict[str, Any]:
        """GET /healthz (no API key): {"status": "ok"} when the daemon is up.
        Raises CubicleError otherwise."""
        out = self._json("GET", "/healthz", retry=True, auth=False)
        if not isinstance(out, dict) or out.get("status") != "ok":
            raise CubicleError(0, "unhealthy", f"daemon health: {out!r}")
        return out

    def info(self) -> Info:
        """The daemon's version, backends (with capabilities) and capacity."""
        return Info.from_dict(self._json("GET", "/v1/info", retry=True))

    def openapi(self) -> dict[str, Any]:
        """The daemon's OpenAPI 3 document."""
        out: dict[str, Any] = self._json("GET", "/v1/openapi.json", retry=True)
        return out

    # Lifecycle.

    def create(
        self,
        *,
        template: str | None = None,
        backend: str | None = None,
        resolution: Resolution | tuple[int, int] | None = None,
        dpi: int | None = None,
        vcpus: int | None = None,
        memory_mb: int | None = None,
        timeout_seconds: int | None = None,
        idle_timeout_seconds: int | None = None,
        start_url: str | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        network: Network | Mapping[str, Any] | None = None,
        volumes: Sequence[VolumeMount | tuple[str, str] | Mapping[str, str]] | None = None,
        auto_pause: bool | None = None,
        from_snapshot: str | None = None,
        wait: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> Sandbox:
        """Starts a sandbox (POST /v1/sandboxes). Fields left None take the
        daemon's defaults. By default it returns once the desktop is ready
        for a screenshot; with wait=False at once, in state "starting" (poll
        get). network is "none", "all" or {"allow": [CIDR, ...]}. volumes
        are (name, path) pairs. from_snapshot starts it from a snapshot (ID
        or name) instead of booting. extra adds body fields this SDK does
        not know. Never retried."""
        if isinstance(resolution, tuple):
            resolution = Resolution(*resolution)
        body = _drop_none(
            {
                "template": template,
                "backend": backend,
                "resolution": resolution.to_dict() if resolution else None,
                "dpi": dpi,
                "vcpus": vcpus,
                "memory_mb": memory_mb,
                "timeout_seconds": timeout_seconds,
                "idle_timeout_seconds": idle_timeout_seconds,
                "start_url": start_url,
                "env": dict(env) if env is not None else None,
                "metadata": dict(metadata) if metadata is not None else None,
                "network": _network(network) if network is not None else None,
                "volumes": [_volume(v) for v in volumes] if volumes is not None else None,
                "auto_pause": auto_pause,
                "from_snapshot": from_snapshot,
            }
        )
        body.update(extra or {})
        query: Query | None = None if wait else {"wait": "false"}
        return Sandbox.from_dict(self._json("POST", "/v1/sandboxes", body, query=query))

    def list_sandboxes(
        self, *, state: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> list[Sandbox]:
        """Lists sandboxes, keeping those in state and whose metadata has
        all the given pairs. Destroyed ones stay listed as "stopped" for a
        while."""
        q: list[tuple[str, str]] = []
        if state:
            q.append(("state", state))
        for k, v in (metadata or {}).items():
            q.append(("metadata." + k, v))
        out = self._json("GET", "/v1/sandboxes", query=q, retry=True)
        return [Sandbox.from_dict(s) for s in out.get("sandboxes") or []]

    def get(self, sandbox_id: str) -> Sandbox:
        """Returns one sandbox; NotFoundError for an unknown id."""
        return Sandbox.from_dict(self._json("GET", _sandbox_path(sandbox_id), retry=True))

    def destroy(self, sandbox_id: str) -> None:
        """Stops a sandbox and frees everything it holds, returning once
        that is done; NotFoundError for an unknown id. A sandbox already
        stopped, and still listed, is destroyed again without error, so a
        retried destroy whose first attempt went through succeeds."""
        self._json("DELETE", _sandbox_path(sandbox_id), retry=True)

    def set_timeout(self, sandbox_id: str, timeout_seconds: int) -> Sandbox:
        """Sets the sandbox's expiry to timeout_seconds from now and returns
        it with its new expires_at. Retried: setting it twice is setting it
        once."""
        body = {"timeout_seconds": timeout_seconds}
        return Sandbox.from_dict(
            self._json("POST", _sandbox_path(sandbox_id, "timeout"), body, retry=True)
        )

    def pause(self, sandbox_id: str) -> Sandbox:
        """Saves a running sandbox to disk and returns it paused.
        NotSupportedError on a backend that cannot pause; ConflictError when
        it is not running."""
        return Sandbox.from_dict(self._json("POST", _sandbox_path(sandbox_id, "pause"), {}))

    def resume(self, sandbox_id: str, timeout_seconds: int = 0) -> Sandbox:
        """Brings a paused sandbox back and returns it running, expiring
        timeout_seconds from now (0: with the time it had left)."""
        body = {"timeout_seconds": timeout_seconds}
        return Sandbox.from_dict(self._json("POST", _sandbox_path(sandbox_id, "resume"), body))

    def metrics(self, sandbox_id: str, *, since: datetime | str | None = None) -> Metrics:
        """The sandbox's resource figures as the host measures them: the
        latest sample and the history kept (after since, when given: a
        timezone-aware datetime, or an RFC 3339 string). Reading them is not
        activity for the idle timeout; ConflictError once the sandbox is
        stopping or gone."""
        q = {"since": _rfc3339(since)} if since is not None else None
        return Metrics.from_dict(
            self._json("GET", _sandbox_path(sandbox_id, "metrics"), query=q, retry=True)
        )

    def logs(
        self,
        sandbox_id: str,
        *,
        since: datetime | str | None = None,
        limit: int | None = None,
        level: str | None = None,
        search: str | None = None,
    ) -> list[LogEntry]:
        """What the sandbox printed on its console, oldest first: the
        agent's log of the session's programs, what they print and, in a
        VM, the kernel. Without since, the newest limit lines (1..1000,
        default 1000); with since (a LogEntry's raw_timestamp, an RFC 3339
        string or an aware datetime), only those after it. level keeps
        that level and worse (debug, info, warn, error); search keeps lines
        containing it. Only the API key that created the sandbox reads its
        logs (NotFoundError for any other); a stopped sandbox's are kept
        while it is listed."""
        q = _drop_none(
            {
                "since": _rfc3339(since) if since is not None else None,
                "limit": limit,
                "level": level,
                "search": search,
            }
        )
        out = self._json("GET", _sandbox_path(sandbox_id, "logs"), query=q or None, retry=True)
        return [LogEntry.from_dict(e) for e in (out or {}).get("logs") or []]

    def fork(self, sandbox_id: str, count: int = 1) -> list[Sandbox]:
        """Copies a running sandbox, as it is, into count (1..10) new
        running sandboxes; all of them or none. NotSupportedError on a
        backend that cannot fork."""
        out = self._json("POST", _sandbox_path(sandbox_id, "fork"), {"count": count})
        return [Sandbox.from_dict(s) for s in out.get("sandboxes") or []]

    # Snapshots.

    def create_snapshot(
        self,
        sandbox_id: str,
        *,
        name: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Snapshot:
        """Saves the running sandbox as a snapshot of this key (it runs
        on). Never retried."""
        body = _drop_none({"name": name, "metadata": dict(metadata) if metadata else None})
        return Snapshot.from_dict(self._json("POST", _sandbox_path(sandbox_id, "snapshots"), body))

    def list_snapshots(self, sandbox_id: str | None = None) -> list[Snapshot]:
        """This key's snapshots, oldest first; with sandbox_id, only those
        taken of it."""
        q = {"sandbox_id": sandbox_id} if sandbox_id else None
        out = self._json("GET", "/v1/snapshots", query=q, retry=True)
        return [Snapshot.from_dict(s) for s in out.get("snapshots") or []]

    def get_snapshot(self, ref: str) -> Snapshot:
        """One snapshot by ID or name."""
        return Snapshot.from_dict(self._json("GET", _name_path("snapshots", ref), retry=True))

    def delete_snapshot(self, ref: str) -> None:
        """Removes a snapshot; sandboxes started from it run on."""
        self._json("DELETE", _name_path("snapshots", ref), retry=True)

    # Volumes.

    def create_volume(self, name: str, size_mb: int) -> Volume:
        """Makes an empty, sparse volume. ConflictError for a name in use.
        Never retried."""
        body = {"name": name, "size_mb": size_mb}
        return Volume.from_dict(self._json("POST", "/v1/volumes", body))

    def list_volumes(self) -> list[Volume]:
        """This key's volumes, by name."""
        out = self._json("GET", "/v1/volumes", retry=True)
        return [Volume.from_dict(v) for v in out.get("volumes") or []]

    def get_volume(self, name: str) -> Volume:
        """One volume; NotFoundError for an unknown name."""
        return Volume.from_dict(self._json("GET", _name_path("volumes", name), retry=True))

    def delete_volume(self, name: str) -> None:
        """Removes a volume and its data; ConflictError while a sandbox
        holds it."""
        self._json("DELETE", _name_path("volumes", name), retry=True)

    # Desktop.

    def screenshot(
        self,
        sandbox_id: str,
        *,
        format: str | None = None,
        quality: int | None = None,
        scale: float | None = None,
        width: int | None = None,
        region: tuple[int, int, int, int] | None = None,
        cursor: bool = False,
    ) -> bytes:
        """Returns the screen as PNG (default) or JPEG bytes. scale (0.1..1)
        or width downscales; region is (x, y, w, h); cursor draws the
        pointer."""
        q: dict[str, str | int | float] = _drop_none(
            {"format": format, "quality": quality, "scale": scale, "width": width}
        )
        if region is not None:
            q.update(zip(("x", "y", "w", "h"), region))
        if cursor:
            q["cursor"] = "true"
        data = self._t.request(
            "GET", _sandbox_path(sandbox_id, "screenshot"), query=q, accept="image/*", retry=True
        )
        assert isinstance(data, bytes)
        return data

    def actions(self, sandbox_id: str, actions: Action | Sequence[Action]) -> ActionsResult:
        """Runs one action (a dict with "type", see API.md) or a list of
        them, in order, in one round trip. The first failing action stops
        the list: InvalidArgumentError (or another CubicleError) whose
        index says which, and whose results hold those that ran. Never
        retried."""
        body: Any = dict(actions) if isinstance(actions, Mapping) else {"actions": [dict(a) for a in actions]}
        return ActionsResult.from_dict(self._json("POST", _sandbox_path(sandbox_id, "actions"), body))

    def _action(self, sandbox_id: str, action: Mapping[str, Any]) -> dict[str, Any]:
        res = self.actions(sandbox_id, [_drop_none(action)]).results
        return res[0] if res else {"type": action["type"]}

    def move(self, sandbox_id: str, x: int, y: int) -> None:
        """Moves the pointer to (x, y)."""
        self._action(sandbox_id, {"type": "move", "x": x, "y": y})

    def click(
        self,
        sandbox_id: str,
        x: int | None = None,
        y: int | None = None,
        *,
        button: str | None = None,
        count: int | None = None,
    ) -> None:
        """Clicks at (x, y), or where the pointer is; button is left
        (default), right or middle; count 1, 2 or 3."""
        self._action(sandbox_id, {"type": "click", "x": x, "y": y, "button": button, "count": count})

    def double_click(self, sandbox_id: str, x: int | None = None, y: int | None = None) -> None:
        """Double-clicks with the left button at (x, y)."""
        self._action(sandbox_id, {"type": "double_click", "x": x, "y": y})

    def drag(self, sandbox_id: str, path: Sequence[tuple[int, int]], *, button: str | None = None) -> None:
        """Drags along path (at least two (x, y) points)."""
        pts = [[x, y] for x, y in path]
        self._action(sandbox_id, {"type": "drag", "path": pts, "button": button})

    def scroll(
        self,
        sandbox_id: str,
        direction: str,
        amount: int = 1,
        *,
        x: int | None = None,
        y: int | None = None,
    ) -> None:
        """Scrolls amount steps up, down, left or right, at (x, y) or where
        the pointer is."""
        self._action(
            sandbox_id, {"type": "scroll", "direction": direction, "amount": amount, "x": x, "y": y}
        )

    def type_text(self, sandbox_id: str, text: str, *, delay_ms: int | None = None) -> None:
        """Types text (any Unicode) into the focused window."""
        self._action(sandbox_id, {"type": "type", "text": text, "delay_ms": delay_ms})

    def key(self, sandbox_id: str, keys: str | Sequence[str]) -> None:
        """Presses and releases a combination: "ctrl+shift+t", "enter", or
        ["ctrl", "l"]."""
        k: str | list[str] = keys if isinstance(keys, str) else list(keys)
        self._action(sandbox_id, {"type": "key", "keys": k})

    def cursor_position(self, sandbox_id: str) -> tuple[int, int]:
        """Where the pointer is, as (x, y)."""
        r = self._action(sandbox_id, {"type": "cursor_position"})
        return int(r.get("x", 0)), int(r.get("y", 0))

    def screen_size(self, sandbox_id: str) -> Resolution:
        """The size of the sandbox's screen."""
        return Resolution.from_dict(self._action(sandbox_id, {"type": "screen_size"}))

    def windows(self, sandbox_id: str) -> list[dict[str, Any]]:
        """The desktop's top-level windows: id, title, class, x, y, width,
        height, focused."""
        return list(self._action(sandbox_id, {"type": "windows"}).get("windows") or [])

    def clipboard_get(self, sandbox_id: str) -> str:
        """The text on the desktop's clipboard (what ctrl+c copied)."""
        return _str_of(self._action(sandbox_id, {"type": "clipboard_get"}).get("text"))

    def clipboard_set(self, sandbox_id: str, text: str) -> None:
        """Puts text (any Unicode, at most 64 KiB) on the desktop's
        clipboard, where it stays until an application copies something
        else."""
        self._action(sandbox_id, {"type": "clipboard_set", "text": text})

    def view(self, sandbox_id: str, *, ttl_seconds: int | None = None, view_only: bool = True) -> View:
        """Mints a live-view URL (a noVNC page needing no API key until it
        expires); view_only=False lets the viewer control the desktop."""
        body = _drop_none({"ttl_seconds": ttl_seconds, "view_only": view_only})
        return View.from_dict(self._json("POST", _sandbox_path(sandbox_id, "view"), body))

    # Vendor computer-use tools: the body and the answer are those of the
    # vendor's API (see the daemon's OpenAPI document).

    def computer_anthropic(self, sandbox_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Runs Anthropic computer-use tool calls (POST .../computer/anthropic).
        body is {"tool"?: tool definition, "input": tool_use input} → a
        tool_result dict, or {"tool"?: ..., "tool_uses": [tool_use blocks]}
        → {"tool_results": [...]}. An error answer raises its CubicleError,
        whose ``body`` also holds the tool_result(s) to send back to the
        model. Never retried."""
        out: dict[str, Any] = self._json(
            "POST", _sandbox_path(sandbox_id, "computer", "anthropic"), dict(body)
        )
        return out

    def computer_openai(self, sandbox_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Runs an OpenAI computer_call (POST .../computer/openai). body is
        {"tool"?: ..., "computer_call": item, "acknowledge_safety_checks"?:
        bool} → a computer_call_output dict. Never retried."""
        out: dict[str, Any] = self._json(
            "POST", _sandbox_path(sandbox_id, "computer", "openai"), dict(body)
        )
        return out

    # Shell.

    @staticmethod
    def _exec_body(
        command: str | None,
        argv: Sequence[str] | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
        user: str | None,
        timeout_seconds: int | None,
        stdin: str | None,
        background: bool,
    ) -> dict[str, Any]:
        if (command is None) == (argv is None):
            raise ValueError("cubicle: exec needs exactly one of command and argv")
        return _drop_none(
            {
                "command": command,
                "argv": list(argv) if argv is not None else None,
                "env": dict(env) if env is not None else None,
                "cwd": cwd,
                "user": user,
                "timeout_seconds": timeout_seconds,
                "stdin": stdin,
                "background": background or None,
            }
        )

    def _exec_timeout(self, timeout_seconds: int | None) -> float | None:
        t = self._t.timeout
        if t is not None and timeout_seconds:
            t = max(t, timeout_seconds + 30.0)
        return t

    def exec(
        self,
        sandbox_id: str,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout_seconds: int | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        """Runs command (by /bin/sh -c) or argv to completion and returns its
        output and exit code; a non-zero exit code is not an error. DISPLAY
        is the sandbox's. Never retried."""
        body = self._exec_body(command, argv, env, cwd, user, timeout_seconds, stdin, False)
        out = self._json(
            "POST", _sandbox_path(sandbox_id, "exec"), body, timeout=self._exec_timeout(timeout_seconds)
        )
        return ExecResult.from_dict(out)

    def exec_background(
        self,
        sandbox_id: str,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> int:
        """Starts a command that keeps running and returns its pid."""
        body = self._exec_body(command, argv, env, cwd, user, None, None, True)
        out = self._json("POST", _sandbox_path(sandbox_id, "exec"), body)
        return int(out.get("pid", 0))

    def exec_stream(
        self,
        sandbox_id: str,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout_seconds: int | None = None,
        stdin: str | None = None,
        read_timeout: float | None = None,
    ) -> ExecStream:
        """Runs a command and streams its output (application/x-ndjson)::

            with c.exec_stream(sid, "make") as s:
                for ev in s:
                    print(ev.stdout, end="")
            print(s.exit_code)

        read_timeout bounds each wait for output (None: no bound; bound the
        command with timeout_seconds). Never retried."""
        body = json.dumps(
            self._exec_body(command, argv, env, cwd, user, timeout_seconds, stdin, False),
            ensure_ascii=False,
        ).encode()
        resp = self._t.request(
            "POST",
            _sandbox_path(sandbox_id, "exec"),
            body=body,
            content_type="application/json",
            accept="application/x-ndjson",
            stream=True,
            timeout=read_timeout,
        )
        assert isinstance(resp, Response)
        return ExecStream(resp)

    # Files.

    def put_file(self, sandbox_id: str, path: str, data: bytes | str) -> FileInfo:
        """Writes data to path (absolute, inside the sandbox), creating
        parent directories. str is written as UTF-8. Retried: writing the
        same bytes twice is writing them once."""
        body = data.encode() if isinstance(data, str) else bytes(data)
        raw = self._t.request(
            "PUT",
            _sandbox_path(sandbox_id, "files"),
            query={"path": path},
            body=body,
            content_type="application/octet-stream",
            retry=True,
        )
        assert isinstance(raw, bytes)
        out = json.loads(raw) if raw.strip() else {}
        return FileInfo.from_dict(out)

    def get_file(self, sandbox_id: str, path: str) -> bytes:
        """Returns the contents of path; NotFoundError when it is missing."""
        data = self._t.request(
            "GET",
            _sandbox_path(sandbox_id, "files"),
            query={"path": path},
            accept="application/octet-stream",
            retry=True,
        )
        assert isinstance(data, bytes)
        return data

    def list_files(self, sandbox_id: str, path: str) -> list[FileEntry]:
        """Lists the directory path."""
        out = self._json("GET", _sandbox_path(sandbox_id, "files", "list"), query={"path": path}, retry=True)
        return [FileEntry.from_dict(e) for e in out.get("entries") or []]

    def delete_file(self, sandbox_id: str, path: str) -> None:
        """Deletes path inside the sandbox."""
        self._json("DELETE", _sandbox_path(sandbox_id, "files"), query={"path": path}, retry=True)

    # Short names. Defined last: inside the class body they shadow the
    # built-ins of the same names.
    list = list_sandboxes
    type = type_text
