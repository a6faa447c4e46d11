"""Typed errors of the cubicle API.

Every error answer of cubicled is a status plus the body
``{"error": {"code": "<snake_case>", "message": "..."}}``. The SDK raises it
as :class:`CubicleError`, or rather as the subclass of its code (``not_found``
→ :class:`NotFoundError`, …), so callers catch what they can handle::

    try:
        c.get(sandbox_id)
    except cubicle.NotFoundError:
        ...

A code this SDK does not know yet maps by its HTTP status, and failing that
to :class:`CubicleError` itself; ``code`` always holds the daemon's code.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = [
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
    "error_from_response",
]


class CubicleError(Exception):
    """An error answer of cubicled, or a failure to get one.

    Attributes:
        status: the HTTP status; 0 when there was no answer (connection
            failures) or the error came inside a 200 exec stream.
        code: the API error code, such as ``"not_found"``. When the body
            has none (a proxy answered, say) it is derived from the status.
        message: the daemon's human-readable message.
        index: for a failed actions call, the position of the action that
            failed (the ones before it ran); ``None`` otherwise.
        results: for a failed actions call, the results of the actions
            that ran before the failing one.
        retry_after: seconds the daemon asked the caller to wait
            (``Retry-After``), if it said.
        body: the error answer as the daemon sent it, decoded, when it was
            a JSON object. The vendor computer-use endpoints put there,
            beside "error", the tool_result (or tool_results) that tells
            the model what went wrong.
    """

    #: The code this class stands for (subclasses).
    default_code: str = ""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        index: int | None = None,
        *,
        results: list[dict[str, Any]] | None = None,
        retry_after: float | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.index = index
        self.results = results
        self.retry_after = retry_after
        self.body = body
        super().__init__(str(self))

    def __str__(self) -> str:
        prefix = ""
        if self.index is not None and not self.message.startswith(f"action {self.index}"):
            # The daemon's messages usually name the action already.
            prefix = f"action {self.index}: "
        where = f"{self.code}, HTTP {self.status}" if self.status else self.code
        return f"{prefix}{self.message or self.code} ({where})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
            f"message={self.message!r}, index={self.index!r})"
        )


class UnauthorizedError(CubicleError):
    """401 unauthorized: a wrong or missing API key."""

    default_code = "unauthorized"


class PermissionDeniedError(CubicleError):
    """403 permission_denied: the sandbox refused access to a path."""

    default_code = "permission_denied"


class NotFoundError(CubicleError):
    """404 not_found: no such sandbox, file, volume or snapshot."""

    default_code = "not_found"


class InvalidArgumentError(CubicleError):
    """400 invalid_argument: a malformed or out-of-range request. For an
    actions call, ``index`` says which action."""

    default_code = "invalid_argument"


class ConflictError(CubicleError):
    """409 conflict: the request does not fit the current state (the
    sandbox is not running, a volume is held, a name is in use)."""

    default_code = "conflict"


class NoDesktopError(CubicleError):
    """409 no_desktop: a desktop call (screenshot, actions, live view) to a
    headless sandbox."""

    default_code = "no_desktop"


class NotSupportedError(CubicleError):
    """409 not_supported: the sandbox's backend cannot do this (pause, fork
    or snapshot on a backend without them)."""

    default_code = "not_supported"


class PayloadTooLargeError(CubicleError):
    """413 payload_too_large: a body or file over the daemon's limit."""

    default_code = "payload_too_large"


class CapacityExhaustedError(CubicleError):
    """429 or 503 capacity_exhausted: no room for another sandbox."""

    default_code = "capacity_exhausted"


class RateLimitedError(CubicleError):
    """429 rate_limited: slow down; ``retry_after`` says for how long."""

    default_code = "rate_limited"


class CubicleTimeoutError(CubicleError):
    """504 timeout: the daemon or the sandbox did not answer in time. (Named
    so as not to shadow the built-in TimeoutError, which a socket timeout of
    the caller's own raises, wrapped in CubicleConnectionError.)"""

    default_code = "timeout"


class UnavailableError(CubicleError):
    """503 unavailable: temporarily unavailable (the sandbox's agent went
    away, the data directory is full)."""

    default_code = "unavailable"


class MethodNotAllowedError(CubicleError):
    """405 method_not_allowed."""

    default_code = "method_not_allowed"


class CanceledError(CubicleError):
    """canceled: the request was canceled."""

    default_code = "canceled"


class InternalError(CubicleError):
    """500 internal: a fault of the daemon (details are in its log)."""

    default_code = "internal"


class CubicleConnectionError(CubicleError):
    """No answer from the daemon: refused, reset, timed out, cut short.
    ``status`` is 0; ``__cause__`` is the underlying exception."""

    default_code = "connection_failed"


class StreamEndedError(CubicleError):
    """A streamed exec ended without an exit code (the connection dropped)."""

    default_code = "stream_ended"


_BY_CODE: dict[str, type[CubicleError]] = {
    cls.default_code: cls
    for cls in (
        UnauthorizedError,
        PermissionDeniedError,
        NotFoundError,
        InvalidArgumentError,
        ConflictError,
        NoDesktopError,
        NotSupportedError,
        PayloadTooLargeError,
        CapacityExhaustedError,
        RateLimitedError,
        CubicleTimeoutError,
        UnavailableError,
        MethodNotAllowedError,
        CanceledError,
        InternalError,
    )
}

# Codes for answers without an error body (a proxy in front of the daemon).
_CODE_BY_STATUS: dict[int, str] = {
    400: "invalid_argument",
    401: "unauthorized",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    429: "rate_limited",
    500: "internal",
    502: "unavailable",
    503: "unavailable",
    504: "timeout",
}


def error_class(code: str, status: int) -> type[CubicleError]:
    """Returns the class for an error code, falling back on the status."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = _BY_CODE.get(_CODE_BY_STATUS.get(status, ""), CubicleError)
    return cls


def parse_retry_after(value: str | None) -> float | None:
    """Parses a Retry-After header: delay-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(int(value)))
    except ValueError:
        pass
    try:
        import email.utils
        import time

        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def error_from_response(status: int, headers: Mapping[str, str], body: bytes) -> CubicleError:
    """Builds the typed error of a non-2xx answer."""
    code, message, index = "", "", None
    results: list[dict[str, Any]] | None = None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        code = str(err.get("code") or "")
        message = str(err.get("message") or "")
        raw_index = err.get("index", doc.get("index"))
        if isinstance(raw_index, int) and not isinstance(raw_index, bool):
            index = raw_index
        if isinstance(doc.get("results"), list):
            results = doc["results"]
    else:
        message = body.decode("utf-8", "replace").strip()
        if len(message) > 200:
            message = message[:200] + "…"
    if not code:
        code = _CODE_BY_STATUS.get(status, "internal")
    cls = error_class(code, status)
    return cls(
        status,
        code,
        message,
        index,
        results=results,
        retry_after=parse_retry_after(headers.get("Retry-After")),
        body=doc if isinstance(doc, dict) else None,
    )
