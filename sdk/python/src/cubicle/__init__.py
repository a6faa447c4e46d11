"""Python SDK for cubicled: isolated virtual desktops for AI agents.

Thin, typed and dependency-free (standard library only)::

    import cubicle

    c = cubicle.Client()          # CUBICLE_URL, CUBICLE_API_KEY
    sb = c.create(resolution=(1024, 768))
    try:
        png = c.screenshot(sb.id)
        c.click(sb.id, 100, 200)
        c.type(sb.id, "hello")
        print(c.exec(sb.id, "uname -a").stdout)
    finally:
        c.destroy(sb.id)

Errors are typed by the API's error codes (see cubicle.errors); idempotent
calls are retried with bounded exponential backoff.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._transport import RetryPolicy
from .client import DEFAULT_URL, Client, ExecStream
from .errors import (
    CanceledError,
    CapacityExhaustedError,
    ConflictError,
    CubicleConnectionError,
    CubicleError,
    CubicleTimeoutError,
    InternalError,
    InvalidArgumentError,
    MethodNotAllowedError,
    NoDesktopError,
    NotFoundError,
    NotSupportedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    StreamEndedError,
    UnauthorizedError,
    UnavailableError,
)
from .models import (
    ActionsResult,
    Backend,
    Capabilities,
    Capacity,
    ExecEvent,
    ExecResult,
    FileEntry,
    FileInfo,
    Info,
    LogEntry,
    Metrics,
    MetricsSample,
    Resolution,
    Runtime,
    Sandbox,
    Snapshot,
    View,
    Volume,
    VolumeMount,
)

__all__ = [
    "__version__",
    "Client",
    "ExecStream",
    "RetryPolicy",
    "DEFAULT_URL",
    "CubicleError",
    "UnauthorizedError",
    "PermissionDeniedError",
    "NotFoundError",
    "InvalidArgumentError",
    "ConflictError",
    "NoDesktopError",
    "NotSupportedError",
    "PayloadTooLargeError",
    "CapacityExhaustedError",
    "RateLimitedError",
    "CubicleTimeoutError",
    "UnavailableError",
    "MethodNotAllowedError",
    "CanceledError",
    "InternalError",
    "CubicleConnectionError",
    "StreamEndedError",
    "ActionsResult",
    "Backend",
    "Capabilities",
    "Capacity",
    "ExecEvent",
    "ExecResult",
    "FileEntry",
    "FileInfo",
    "Info",
    "LogEntry",
    "Metrics",
    "MetricsSample",
    "Resolution",
    "Runtime",
    "Sandbox",
    "Snapshot",
    "View",
    "Volume",
    "VolumeMount",
]
