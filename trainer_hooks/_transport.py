"""HTTP to the lldmon service: one attempt per call, never raises; retry policy and classification.

Classification (`contracts.spool.outcome_for_status`): 2xx ok; a connection error, a timeout, 408,
429, 500, 502, 503 and 504 are *transient* (retried in the live path with exponential backoff and
jitter, honouring Retry-After); 401, 403, 404 and 409 are kept for later (spooled, never retried
in a loop); any other 4xx means the batch itself is invalid: rejected, never retried.
"""

from __future__ import annotations

import contextlib
import email.utils
import random
import time
from dataclasses import dataclass
from typing import Any, Final

import httpx

from contracts.spool import Outcome, outcome_for_status
from contracts.wire import API_PREFIX, MAX_BODY_HEADER

TRANSIENT_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of one batch in the live path, and the pace of reconnection attempts.

    Attributes:
        attempts: tries per batch before it is spooled (transient failures only).
        backoff_base: first backoff in seconds; doubles per retry, with jitter in [0.5, 1] x.
        backoff_max: cap of one backoff; also the longest wait between reconnection attempts
            while the service is unreachable.
        max_retry_after: cap on a server's Retry-After (seconds).
    """

    attempts: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_retry_after: float = 60.0

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0-based), with jitter."""
        delay = min(self.backoff_max, self.backoff_base * 2.0 ** min(retry, 30))
        return delay * random.uniform(0.5, 1.0)


@dataclass(frozen=True)
class Reply:
    """What one HTTP attempt gave. `status` is None for a connection error or timeout."""

    status: int | None
    data: Any = None
    error: str = ""
    retry_after: float | None = None
    body_limit: int | None = None
    """The service's body limit, from `contracts.wire.MAX_BODY_HEADER` (None: not announced)."""

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


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date); None if absent or invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _body_limit(value: str | None) -> int | None:
    if value is None or not (value.isascii() and value.isdigit()):  # '²'.isdigit(), but not for int()
        return None
    return int(value) or None


def _error_text(response: httpx.Response, data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        field = f" (field {err['field']})" if err.get("field") else ""
        return f"{err.get('message', '')}{field}"
    return response.text[:300]


class HttpSession:
    """A thin httpx wrapper: `request` makes one attempt and returns a `Reply`, never raising."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout: float,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"user-agent": "lldmon-client/0.1", "accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._client = httpx.Client(
            base_url=url.rstrip("/") + API_PREFIX, headers=headers, timeout=timeout, transport=transport
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        gzipped: bool = False,
        timeout: float | None = None,
    ) -> Reply:
        headers: dict[str, str] = {}
        if content is not None:
            headers["content-type"] = "application/json"
            if gzipped:
                headers["content-encoding"] = "gzip"
        kwargs: dict[str, Any] = {"content": content, "headers": headers}
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            response = self._client.request(method, path, **kwargs)
        except Exception as exc:  # connection refused, timeout, protocol error, bad URL, ...
            return Reply(status=None, error=f"{type(exc).__name__}: {exc}")
        try:
            data = response.json()
        except ValueError:
            data = None
        error = "" if response.is_success else _error_text(response, data)
        return Reply(
            status=response.status_code,
            data=data,
            error=error,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            body_limit=_body_limit(response.headers.get(MAX_BODY_HEADER)),
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing must not raise
            self._client.close()
