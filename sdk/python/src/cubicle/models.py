"""Typed views of the cubicle API's JSON answers.

Each class is a dataclass built by ``from_dict``, which ignores fields it
does not know (the daemon may add some) and keeps the whole answer in
``raw``. Times are timezone-aware datetimes, ``None`` when absent.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Mapping

__all__ = [
    "Resolution",
    "VolumeMount",
    "Sandbox",
    "ExecResult",
    "ExecEvent",
    "FileInfo",
    "FileEntry",
    "ActionsResult",
    "View",
    "Volume",
    "Snapshot",
    "Capabilities",
    "Backend",
    "Capacity",
    "Info",
    "Metrics",
    "MetricsSample",
    "LogEntry",
    "Network",
    "SandboxState",
]

#: Sandbox states (Sandbox.state).
SandboxState = Literal[
    "starting", "running", "pausing", "paused", "resuming", "stopping", "stopped", "failed"
]

#: A network policy for create: "none", "all", or {"allow": ["CIDR", ...]}.
Network = str | Mapping[str, list[str]]


def _time(v: Any) -> datetime | None:
    if not isinstance(v, str) or not v:
        return None
    try:
        return datetime.fromisoformat(v)
    except ValueError:
        return None


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


@dataclass(frozen=True)
class Resolution:
    """A screen size in pixels."""

    width: int
    height: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Resolution:
        d = d or {}
        return cls(_int(d.get("width")), _int(d.get("height")))

    def to_dict(self) -> dict[str, int]:
        return {"width": self.width, "height": self.height}


@dataclass(frozen=True)
class VolumeMount:
    """Attaches the volume ``name`` at the absolute ``path`` in a sandbox."""

    name: str
    path: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VolumeMount:
        return cls(_str(d.get("name")), _str(d.get("path")))

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "path": self.path}


@dataclass
class Sandbox:
    """The daemon's view of one sandbox."""

    id: str
    state: str
    template: str = ""
    backend: str = ""
    #: vm, gvisor or namespace.
    isolation: str = ""
    resolution: Resolution = field(default_factory=lambda: Resolution(0, 0))
    created_at: datetime | None = None
    expires_at: datetime | None = None
    last_active_at: datetime | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    ip: str = ""
    volumes: list[VolumeMount] = field(default_factory=list)
    #: False for a headless sandbox; None until it has started.
    desktop: bool | None = None
    #: Why it failed; set only in state "failed".
    error: str = ""
    paused_at: datetime | None = None
    paused_bytes: int = 0
    auto_pause: bool = False
    from_snapshot: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sandbox:
        desktop = d.get("desktop")
        return cls(
            id=_str(d.get("id")),
            state=_str(d.get("state")),
            template=_str(d.get("template")),
            backend=_str(d.get("backend")),
            isolation=_str(d.get("isolation")),
            resolution=Resolution.from_dict(d.get("resolution")),
            created_at=_time(d.get("created_at")),
            expires_at=_time(d.get("expires_at")),
            last_active_at=_time(d.get("last_active_at")),
            metadata=dict(d.get("metadata") or {}),
            ip=_str(d.get("ip")),
            volumes=[VolumeMount.from_dict(v) for v in d.get("volumes") or []],
            desktop=desktop if isinstance(desktop, bool) else None,
            error=_str(d.get("error")),
            paused_at=_time(d.get("paused_at")),
            paused_bytes=_int(d.get("paused_bytes")),
            auto_pause=bool(d.get("auto_pause")),
            from_snapshot=_str(d.get("from_snapshot")),
            raw=dict(d),
        )


@dataclass
class ExecResult:
    """The outcome of a finished command. A non-zero exit code is not an
    error."""

    exit_code: int
    stdout: str
    stderr: str
    duration_ms: int = 0
    #: The output exceeded the daemon's cap and was cut short.
    truncated: bool = False
    #: timeout_seconds killed the command (exit_code is then -1).
    timed_out: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecResult:
        return cls(
            exit_code=_int(d.get("exit_code"), -1),
            stdout=_str(d.get("stdout")),
            stderr=_str(d.get("stderr")),
            duration_ms=_int(d.get("duration_ms")),
            truncated=bool(d.get("truncated")),
            timed_out=bool(d.get("timed_out")),
        )


@dataclass(frozen=True)
class ExecEvent:
    """One line of a streamed command's output: a chunk of stdout or
    stderr, a truncation notice, or (last) the exit code."""

    stdout: str = ""
    stderr: str = ""
    #: Set on the final event only.
    exit_code: int | None = None
    #: The daemon stopped forwarding output at its cap.
    truncated: bool = False
    #: Set on the final event when the command's timeout killed it.
    timed_out: bool = False
    duration_ms: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecEvent:
        code = d.get("exit_code")
        return cls(
            stdout=_str(d.get("stdout")),
            stderr=_str(d.get("stderr")),
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            truncated=bool(d.get("truncated")),
            timed_out=bool(d.get("timed_out")),
            duration_ms=_int(d.get("duration_ms")),
        )


@dataclass(frozen=True)
class FileInfo:
    """The answer to a file upload."""

    path: str
    size: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FileInfo:
        return cls(_str(d.get("path")), _int(d.get("size")))


def _mode(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v:
        try:
            return int(v.removeprefix("0o"), 8)
        except ValueError:
            return 0
    return 0


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory listing."""

    name: str
    path: str
    #: "file", "dir" or "symlink".
    type: str
    size: int
    #: The Unix mode bits.
    mode: int
    modified_at: datetime | None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FileEntry:
        return cls(
            name=_str(d.get("name")),
            path=_str(d.get("path")),
            type=_str(d.get("type")),
            size=_int(d.get("size")),
            mode=_mode(d.get("mode")),
            modified_at=_time(d.get("modified_at")),
        )


@dataclass
class ActionsResult:
    """The answer to an actions call: one result per action, in order.
    A result is a dict with "type" and the type's fields (x, y for
    cursor_position; width, height for screen_size; format, width,
    height and base64 data for screenshot; windows for windows)."""

    results: list[dict[str, Any]]
    duration_ms: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ActionsResult:
        return cls(list(d.get("results") or []), _int(d.get("duration_ms")))

    def screenshots(self) -> list[bytes]:
        """Returns the decoded images of the screenshot actions, in order."""
        return [
            base64.b64decode(r.get("data") or "")
            for r in self.results
            if r.get("type") == "screenshot"
        ]


@dataclass(frozen=True)
class View:
    """A live-view URL: a noVNC page that needs no API key until it
    expires."""

    url: str
    expires_at: datetime | None
    view_only: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> View:
        return cls(_str(d.get("url")), _time(d.get("expires_at")), bool(d.get("view_only")))


@dataclass(frozen=True)
class Volume:
    """A persistent disk of this API key."""

    name: str
    size_mb: int
    created_at: datetime | None
    #: The sandbox that holds it now ("" when free).
    attached_to: str
    #: Host disk it takes now (its file is sparse).
    used_mb: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Volume:
        return cls(
            name=_str(d.get("name")),
            size_mb=_int(d.get("size_mb")),
            created_at=_time(d.get("created_at")),
            attached_to=_str(d.get("attached_to")),
            used_mb=_int(d.get("used_mb")),
        )


@dataclass
class Snapshot:
    """A running sandbox saved as it was; sandboxes start from it by ID or
    name (create(from_snapshot=...))."""

    id: str
    name: str
    sandbox_id: str
    template: str
    backend: str
    resolution: Resolution
    vcpus: int
    memory_mb: int
    size_bytes: int
    created_at: datetime | None
    metadata: dict[str, str]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Snapshot:
        return cls(
            id=_str(d.get("id")),
            name=_str(d.get("name")),
            sandbox_id=_str(d.get("sandbox_id")),
            template=_str(d.get("template")),
            backend=_str(d.get("backend")),
            resolution=Resolution.from_dict(d.get("resolution")),
            vcpus=_int(d.get("vcpus")),
            memory_mb=_int(d.get("memory_mb")),
            size_bytes=_int(d.get("size_bytes")),
            created_at=_time(d.get("created_at")),
            metadata=dict(d.get("metadata") or {}),
        )


@dataclass(frozen=True)
class Capabilities:
    """A backend's optional features on this host."""

    volumes: bool = False
    pause: bool = False
    pause_reason: str = ""
    snapshot: bool = False
    snapshot_reason: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Capabilities:
        d = d or {}
        return cls(
            volumes=bool(d.get("volumes")),
            pause=bool(d.get("pause")),
            pause_reason=_str(d.get("pause_reason")),
            snapshot=bool(d.get("snapshot")),
            snapshot_reason=_str(d.get("snapshot_reason")),
        )


@dataclass(frozen=True)
class Runtime:
    """The program a backend runs its sandboxes with (runsc, runc)."""

    name: str
    path: str
    version: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Runtime | None:
        if not d:
            return None
        return cls(name=_str(d.get("name")), path=_str(d.get("path")), version=_str(d.get("version")))


@dataclass(frozen=True)
class Backend:
    """One sandbox backend of the daemon."""

    name: str
    available: bool
    isolation: str
    reason: str
    capabilities: Capabilities
    runtime: Runtime | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Backend:
        return cls(
            name=_str(d.get("name")),
            available=bool(d.get("available")),
            isolation=_str(d.get("isolation")),
            reason=_str(d.get("reason")),
            capabilities=Capabilities.from_dict(d.get("capabilities")),
            runtime=Runtime.from_dict(d.get("runtime")),
        )


@dataclass(frozen=True)
class Capacity:
    """How many sandboxes the daemon runs and may run."""

    max_sandboxes: int
    running: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Capacity:
        d = d or {}
        return cls(_int(d.get("max_sandboxes")), _int(d.get("running")))


@dataclass
class Info:
    """The daemon's version, backends and capacity (GET /v1/info)."""

    version: str
    backends: list[Backend]
    default_backend: str
    capacity: Capacity
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Info:
        return cls(
            version=_str(d.get("version")),
            backends=[Backend.from_dict(b) for b in d.get("backends") or []],
            default_backend=_str(d.get("default_backend")),
            capacity=Capacity.from_dict(d.get("capacity")),
            raw=dict(d),
        )


def _float(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


@dataclass(frozen=True)
class MetricsSample:
    """One sample of a sandbox's resource figures, as the host measures
    them. ``network`` is None for a sandbox without a network; the others
    are the API's nested objects (see the OpenAPI document)."""

    timestamp: datetime | None
    #: Share of the sandbox's CPUs used since the previous sample, 0-100.
    cpu_percent: float
    #: CPUs' worth the sandbox may use.
    cpu_count: float
    #: CPU time used since the box started.
    cpu_used_seconds: float
    memory_used_bytes: int
    memory_cache_bytes: int
    #: 0 when no limit is known.
    memory_limit_bytes: int
    disk_used_bytes: int
    #: 0 when unbounded.
    disk_limit_bytes: int
    network: dict[str, int] | None = None

    @property
    def cores_used(self) -> float:
        """CPU cores' worth used over the sample's interval."""
        return self.cpu_percent * self.cpu_count / 100

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MetricsSample:
        cpu = d.get("cpu") or {}
        mem = d.get("memory") or {}
        disk = d.get("disk") or {}
        net = d.get("network")
        return cls(
            timestamp=_time(d.get("timestamp")),
            cpu_percent=_float(cpu.get("percent")),
            cpu_count=_float(cpu.get("count")),
            cpu_used_seconds=_float(cpu.get("used_seconds")),
            memory_used_bytes=_int(mem.get("used_bytes")),
            memory_cache_bytes=_int(mem.get("cache_bytes")),
            memory_limit_bytes=_int(mem.get("limit_bytes")),
            disk_used_bytes=_int(disk.get("used_bytes")),
            disk_limit_bytes=_int(disk.get("limit_bytes")),
            network={k: _int(v) for k, v in net.items()} if isinstance(net, Mapping) else None,
        )


@dataclass
class Metrics:
    """A sandbox's resource figures (GET /v1/sandboxes/{id}/metrics): the
    latest sample (None until the first, one interval after it starts
    running) and the history the daemon keeps, oldest first."""

    sandbox_id: str
    backend: str
    state: str
    interval_seconds: float
    window_seconds: float
    latest: MetricsSample | None
    samples: list[MetricsSample]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Metrics:
        latest = d.get("latest")
        return cls(
            sandbox_id=_str(d.get("sandbox_id")),
            backend=_str(d.get("backend")),
            state=_str(d.get("state")),
            interval_seconds=_float(d.get("interval_seconds")),
            window_seconds=_float(d.get("window_seconds")),
            latest=MetricsSample.from_dict(latest) if isinstance(latest, Mapping) else None,
            samples=[MetricsSample.from_dict(s) for s in d.get("samples") or []],
            raw=dict(d),
        )


@dataclass(frozen=True)
class LogEntry:
    """One line a sandbox printed on its console
    (GET /v1/sandboxes/{id}/logs)."""

    #: When it was printed (the agent's time) or read by the daemon;
    #: unique per sandbox and in printing order, to the nanosecond (kept
    #: in ``raw_timestamp``: a datetime holds microseconds only).
    timestamp: datetime | None
    #: debug, info, warn or error.
    level: str
    #: agent (the sandbox agent's own log), console (anything else the
    #: sandbox printed) or cubicled (the daemon's notes).
    source: str
    message: str
    #: The key=value pairs of an agent line.
    fields: dict[str, str] = field(default_factory=dict)
    #: The timestamp as the daemon wrote it: pass it as ``since`` to
    #: get only the lines after this one.
    raw_timestamp: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LogEntry:
        ts = _str(d.get("timestamp"))
        return cls(
            timestamp=_time(ts),
            level=_str(d.get("level")),
            source=_str(d.get("source")),
            message=_str(d.get("message")),
            fields={str(k): _str(v) for k, v in (d.get("fields") or {}).items()},
            raw_timestamp=ts,
        )
