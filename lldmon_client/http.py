"""HTTP to the lldmon service: one attempt per call, never raising; the retry policy and the
classification of answers.

Classification (`contracts.spool.outcome_for_status`): 2xx ok; a connection error, a timeout, 408,
429, 500, 502, 503 and 504 are *transient* (worth retrying soon, honouring Retry-After); 401, 403,
404 and 409 are kept for later (the batch is fine, the service will not take it now); any other 4xx
means the batch itself is invalid: rejected, never retried.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

import httpx

from contracts.spool import Outcome, outcome_for_status
from contracts.wire import MAX_BODY_HEADER
from lldmon_client.urls import api_url

__all__ = ["TRANSIENT_STATUSES", "Reply", "RetryPolicy", "ServiceError", "Session", "parse_retry_after"]

TRANSIENT_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})
USER_AGENT: Final = "lldmon-client/0.1"


@dataclass(frozen=True)
class RetryPolicy:
    """How often one request is tried, and how long to wait in between.

    Attributes:
        attempts: tries of one request on transient failures; None: until the caller stops it.
        backoff_base: first backoff in seconds; doubles per retry, with jitter in [0.5, 1] x.
        backoff_max: cap of one backoff; also the longest wait between reconnection attempts
            while the service is unreachable.
        max_retry_after: cap on a server's Retry-After (seconds).
    """

    attempts: int | None = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_retry_after: float = 60.0

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0-based), with jitter."""
        delay = min(self.backoff_max, self.backoff_base * 2.0 ** min(retry, 30))
        return delay * random.uniform(0.5, 1.0)

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `retry`: the server's Retry-After (capped) if it sent
        one, else the backoff."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        return self.backoff(retry)


class ServiceError(Exception):
    """An answer the caller cannot go on without (`Reply.raise_for_status`)."""


@dataclass(frozen=True)
class Reply:
    """What one HTTP attempt gave. `status` is None for a connection error or timeout."""

    status: int | None
    data: Any = None
    error: str = ""
    """The service's error message (and field), the start of another server's page, or the
    transport's error; empty for a success."""
    retry_after: float | None = None
    body_limit: int | None = None
    """The service's body limit, from `contracts.wire.MAX_BODY_HEADER` (None: not announced)."""
    response: httpx.Response | None = field(default=None, repr=False, compare=False)
    """The answer itself (None for a connection error), for callers that read more of it."""

    @property
    def outcome(self) -> Outcome:
        return "retry" if self.status is None else outcome_for_status(self.status)

    @property
    def transient(self) -> bool:
        return self.status is None or self.status in TRANSIENT_STATUSES

    @property
    def error_code(self) -> str:
        if isinstance(self.data, dict) and isinstance(self.data.get("error"), dict):
            return str(self.data["error"].get("code", ""))
        return ""

    def describe(self) -> str:
        """Why it failed, on one line: "HTTP 422 <message>" or the transport's error."""
        if self.status is None:
            return self.error
        return f"HTTP {self.status} {' '.join(self.error.split())[:300]}".rstrip()

    def raise_for_status(self, what: str) -> Reply:
        """This reply if it is a success; else ServiceError "<what>: <describe()>"."""
        if self.outcome != "ok":
            raise ServiceError(f"{what}: {self.describe()}")
        return self


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date); None if absent or invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": RFC 9110 dates are GMT
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def body_limit(value: str | None) -> int | None:
    """The body limit a `MAX_BODY_HEADER` names; None if absent, zero or not plain ASCII digits."""
    if value is None or not (value.isascii() and value.isdigit()):  # '²'.isdigit(), but not for int()
        return None
    return int(value) or None


def error_text(response: httpx.Response, data: Any) -> str:
    """The API's error (`{"error": {"message", "field"}}`), a framework's `detail`, or the body's text."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        where = f" (field {err['field']})" if err.get("field") else ""
        return f"{err.get('message', '')}{where}"
    if isinstance(data, dict) and "detail" in data:
        return str(data["detail"])[:300]
    return response.text[:300]


class Session:
    """An httpx client on the service's API (base URL, bearer token, user agent): `request` makes one
    attempt and returns a `Reply`, never raising. `http` is the httpx client itself, for callers that
    read answers their own way; it is made on first use, so a session that never sends costs nothing.

    `deadline` (monotonic seconds, read on every request) cuts each request's timeout to the time
    left before it, so a client that must be done by then is never held up by a slow answer.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        user_agent: str = USER_AGENT,
        deadline: Callable[[], float] | None = None,
    ) -> None:
        self.base_url = api_url(url)
        self.has_token = bool(token)
        self.timeout = float(timeout)
        self._deadline = deadline
        self._headers = {"user-agent": user_agent, "accept": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._transport = transport
        self._http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(
                base_url=self.base_url, headers=self._headers, timeout=self.timeout, transport=self._transport
            )
        return self._http

    def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        json: Any = None,
        gzipped: bool = False,
        params: dict[str, Any] | None = None,
    ) -> Reply:
        headers: dict[str, str] = {}
        if content is not None:
            headers["content-type"] = "application/json"
            if gzipped:
                headers["content-encoding"] = "gzip"
        try:
            response = self.http.request(
                method,
                path,
                content=content,
                json=json,
                params=params,
                headers=headers,
                timeout=self._timeout(),
            )
        except Exception as exc:  # connection refused, timeout, protocol error, bad URL, ...
            return Reply(status=None, error=f"{type(exc).__name__}: {exc}")
        try:
            data = response.json()
        except ValueError:
            data = None
        return Reply(
            status=response.status_code,
            data=data,
            error="" if response.is_success else error_text(response, data),
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            body_limit=body_limit(response.headers.get(MAX_BODY_HEADER)),
            response=response,
        )

    def _timeout(self) -> float:
        if self._deadline is None:
            return self.timeout
        return max(0.05, min(self.timeout, self._deadline() - time.monotonic()))

    def close(self) -> None:
        if self._http is not None:
            with contextlib.suppress(Exception):  # closing must not raise
                self._http.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
