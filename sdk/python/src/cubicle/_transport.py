"""HTTP transport of the SDK: one connection per request (http.client, no
proxies from the environment), the API key header, typed errors, and
retries of idempotent calls with bounded exponential backoff."""

from __future__ import annotations

import http.client
import json
import random
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .errors import CubicleConnectionError, CubicleError, error_from_response

#: Statuses worth another attempt of an idempotent call.
RETRY_STATUSES = frozenset({429, 502, 503, 504})

#: How much of an error answer is read.
_MAX_ERROR_BODY = 64 << 10

class _Default:
    """The type of DEFAULT."""


#: Stands for "the transport's own timeout" in request().
DEFAULT = _Default()

Query = Mapping[str, str | int | float | bool] | Sequence[tuple[str, str]]


@dataclass(frozen=True)
class RetryPolicy:
    """How idempotent calls are retried: at most ``max_retries`` extra
    attempts, waiting about ``backoff``, 2×, 4×… seconds between them (with
    jitter, each wait capped at ``max_backoff``), or longer when the daemon
    asks with Retry-After (also capped at ``max_backoff``)."""

    max_retries: int = 3
    backoff: float = 0.2
    max_backoff: float = 10.0

    def delay(self, attempt: int, last: CubicleError | None) -> float:
        """Returns the wait before attempt ``attempt`` (≥ 1)."""
        d = min(self.backoff * (2 ** (attempt - 1)), self.max_backoff)
        # "Equal jitter": half fixed, half random, so clients spread out.
        d = d / 2 + random.uniform(0, d / 2)
        if last is not None and last.retry_after is not None:
            d = max(d, min(last.retry_after, self.max_backoff))
        return d


class Response:
    """A 2xx answer whose body has not been read (streaming calls). Close it
    (or use it as a context manager) to free the connection."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self.raw = resp
        self.status = resp.status
        self.headers = resp.headers

    def readline(self) -> bytes:
        return self.raw.readline()

    def read(self) -> bytes:
        return self.raw.read()

    def close(self) -> None:
        try:
            self.raw.close()
        finally:
            self._conn.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transport:
    """Sends requests to one daemon. Safe for concurrent use: it holds no
    connection between calls."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float | None,
        retry: RetryPolicy,
        user_agent: str,
        ssl_context: ssl.SSLContext | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        u = urllib.parse.urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"cubicle: bad base URL {base_url!r}: want http[s]://host[:port]")
        self.base_url = base_url.rstrip("/")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path
        self.api_key = api_key
        self.timeout = timeout
        self.retry = retry
        self.user_agent = user_agent
        self._ssl = ssl_context
        #: Waits between attempts; tests may replace it.
        self.sleep = sleep

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def url(self, path: str, query: Query | None = None) -> str:
        """Returns the request target (path and query) for path."""
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        return target

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
        retry: bool = False,
        timeout: float | None | _Default = DEFAULT,
        stream: bool = False,
        auth: bool = True,
    ) -> Response | bytes:
        """Performs a request and returns the body of its 2xx answer (or,
        with stream, the unread Response). Any other answer raises its
        typed CubicleError; so does a connection failure, as
        CubicleConnectionError. With retry, connection failures and
        RETRY_STATUSES are retried per the policy."""
        target = self.url(path, query)
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        if auth and self.api_key:
            headers["X-API-Key"] = self.api_key
        if body is not None:
            headers["Content-Type"] = content_type or "application/octet-stream"
        elif method in ("POST", "PUT"):
            headers["Content-Length"] = "0"
        t = self.timeout if isinstance(timeout, _Default) else timeout
        attempts = 1 + (max(0, self.retry.max_retries) if retry else 0)
        last: CubicleError | None = None
        for attempt in range(attempts):
            if attempt:
                self.sleep(self.retry.delay(attempt, last))
            try:
                return self._attempt(method, target, headers, body, t, stream)
            except CubicleConnectionError as e:
                last = e
            except CubicleError as e:
                if e.status not in RETRY_STATUSES:
                    raise
                last = e
        assert last is not None
        raise last

    def _attempt(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float | None,
        stream: bool,
    ) -> Response | bytes:
        conn = self._connect(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            if 200 <= resp.status < 300:
                if stream:
                    out = Response(conn, resp)
                    conn = None  # type: ignore[assignment]  # the Response owns it now
                    return out
                return resp.read()
            data = resp.read(_MAX_ERROR_BODY)
            raise error_from_response(resp.status, resp.headers, data)
        except (OSError, http.client.HTTPException) as e:
            raise CubicleConnectionError(
                0, CubicleConnectionError.default_code, f"{method} {target}: {e!r}"
            ) from e
        finally:
            if conn is not None:
                conn.close()

    def json(self, method: str, path: str, payload: Any = None, **kw: Any) -> Any:
        """Performs a request with a JSON body (unless payload is None) and
        decodes its JSON answer (None for an empty one, such as 204)."""
        body = None
        if payload is not None:
            body = json.dumps(payload, ensure_ascii=False).encode()
            kw.setdefault("content_type", "application/json")
        data = self.request(method, path, body=body, **kw)
        assert isinstance(data, bytes)
        if not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise CubicleError(0, "bad_answer", f"{method} {path}: answer is not JSON: {e}") from e
