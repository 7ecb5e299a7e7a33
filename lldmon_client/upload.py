"""`Uploader.send(run_id, kind, body) -> Outcome`: one ingest body to the service, whole or in parts.

What every sender of batches shares, written once:

- The body is cut (`contracts.split`) under the byte limit the service named (its `MAX_BODY_HEADER`,
  adopted with `adopt_limit`, or a 413's message); parts get batch ids derived from the body's, so
  cutting the same body again gives the same ids and a repeated send stays a duplicate.
- Each part is POSTed gzip-compressed, retried on transient failures as the `RetryPolicy` says
  (Retry-After honoured), between `pause`s the caller controls.
- A 413 lowers the limit to the one the service names (else half of what it refused) and the refused
  part goes again in smaller parts, each smaller than itself; only a part that cannot be cut (one
  value) counts as refused.
- The outcome says which parts the service acknowledged, which it refused as invalid (sending goes on
  past them: the others are good data), and which were not delivered because an answer said "later"
  (a transient failure past the retries, 401/403/404/409): that part and every part after it.

`send_combined(run_id, metrics, actions)` sends a step's metrics and actions bodies in one request
(`/runs/{id}/combined`, one transaction on the service) when they fit in one body: a trainer's second
request per step costs the service about as much again as the first. Each half is acknowledged under
its own batch id, so its outcome is what `send` would give, and a half kept for later is re-sent alone
(the spool keeps bodies per kind) and is a duplicate there if the combined request did store it. Any
answer other than an acknowledgement or "later" (413, 422, 409: perhaps only one half is at fault; a
service without the endpoint) makes each half go on its own through `send`, which cuts, learns limits
and sorts good parts from refused ones as usual.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from contracts import split
from contracts.spool import Outcome as Verdict
from lldmon_client.http import Reply, RetryPolicy, Session

__all__ = ["COMBINED_PATH", "MIN_BODY_BYTES", "Kind", "Outcome", "Sent", "Uploader"]

Kind = Literal["metrics", "actions"]
COMBINED_PATH = "combined"
"""`/runs/{id}/combined`: a metrics and an actions body in one request (`send_combined`)."""
MIN_BODY_BYTES = 1024
"""No limit a service names lowers the client's below this: bodies of one value must still go."""


@dataclass(frozen=True)
class Sent:
    """One part and the service's answer to it."""

    body: dict[str, Any]
    reply: Reply

    @property
    def duplicate(self) -> bool:
        """Acknowledged as already stored (a re-send after a lost acknowledgement)."""
        return isinstance(self.reply.data, dict) and bool(self.reply.data.get("duplicate"))


@dataclass
class Outcome:
    """What became of one body (`Uploader.send`), part by part, in the order sent."""

    delivered: list[Sent] = field(default_factory=list)
    refused: list[Sent] = field(default_factory=list)
    """Parts the service refused as invalid: never worth sending again as they are."""
    unsent: list[dict[str, Any]] = field(default_factory=list)
    """Parts not delivered: the one `reply` answered, and every part after it."""
    reply: Reply | None = None
    """The answer that stopped the sending (None if nothing did)."""

    @property
    def verdict(self) -> Verdict:
        """As `contracts.spool.replay` takes it: "retry" if anything is left to send, else "reject"
        if a part was refused, else "ok"."""
        if self.unsent:
            return "retry"
        return "reject" if self.refused else "ok"

    @property
    def failure(self) -> Reply | None:
        """The answer to report: the one that stopped the sending, else the first refusal."""
        if self.reply is not None:
            return self.reply
        return self.refused[0].reply if self.refused else None


_STOPPED = Reply(status=None, error="stopped")


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return True


class Uploader:
    """Sends ingest bodies and other requests through `session` (see the module docstring).

    Args:
        session: the HTTP session (base URL, token, timeouts).
        retry: attempts and waits of one request on transient failures.
        max_bytes: bytes of encoded JSON per request until the service names less.
        encode: the JSON encoding whose size counts (`contracts.split.encode_compact`).
        pause: waits `seconds` before a retry; returns False to give up instead (a stop, a deadline).
        stopped: True when no further request may start (checked before each one).
        on_retry: told `(retry number, reply)` before each retry's pause (to say so).
        on_learn: told `(refused size, new limit)` when a 413 lowers the limit.
    """

    def __init__(
        self,
        session: Session,
        *,
        retry: RetryPolicy | None = None,
        max_bytes: int = split.DEFAULT_MAX_BODY_BYTES,
        encode: split.Encode = split.encode_compact,
        pause: Callable[[float], bool] = _sleep,
        stopped: Callable[[], bool] | None = None,
        on_retry: Callable[[int, Reply], object] | None = None,
        on_learn: Callable[[int, int], object] | None = None,
    ) -> None:
        self.session = session
        self.retry = retry or RetryPolicy()
        self.max_bytes = max(MIN_BODY_BYTES, int(max_bytes))
        self.encode = encode
        self._pause = pause
        self._stopped = stopped
        self._on_retry = on_retry
        self._on_learn = on_learn
        self.combined = True
        """Whether `send_combined` still tries one request (False once the service showed it has no
        such endpoint)."""

    def adopt_limit(self, limit: int | None) -> bool:
        """Take the body limit the service announces (`Reply.body_limit`) if it is lower than ours, so
        no body is refused with a 413; True if it was."""
        if limit is None or limit >= self.max_bytes:
            return False
        self.max_bytes = max(MIN_BODY_BYTES, limit)
        return True

    def split(self, kind: str, body: Mapping[str, Any]) -> list[tuple[dict[str, Any], bytes]]:
        """`body` as (part, encoded part) pairs under the current limit."""
        return split.split_body(kind, body, self.max_bytes, self.encode)

    def request(self, method: str, path: str, *, attempts: int | None = None, **kwargs: Any) -> Reply:
        """`session.request`, tried again on transient failures: up to `attempts` times (default: the
        policy's), pausing in between; the last reply. A stop before an attempt gives a connection-
        error-like reply (status None, error "stopped")."""
        limit = self.retry.attempts if attempts is None else attempts
        retry = 0
        while True:
            if self._stopped is not None and self._stopped():
                return _STOPPED
            reply = self.session.request(method, path, **kwargs)
            if not reply.transient or (limit is not None and retry + 1 >= limit):
                return reply
            if self._on_retry is not None:
                self._on_retry(retry, reply)
            if not self._pause(self.retry.delay(retry, reply.retry_after)):
                return reply
            retry += 1

    def send(
        self, run_id: int, kind: Kind, body: Mapping[str, Any], *, attempts: int | None = None
    ) -> Outcome:
        """POST `body` to `/runs/{run_id}/{kind}`, in parts under the byte limit (see the module
        docstring); `attempts` per part as in `request`."""
        outcome = Outcome()
        pending = self.split(kind, body)
        while pending:
            part, raw = pending.pop(0)
            reply = self._post(f"/runs/{run_id}/{kind}", raw, attempts)
            if reply.status == 413:
                self._learn(reply, len(raw))
                smaller = split.split_body(kind, part, min(self.max_bytes, len(raw) - 1), self.encode)
                if len(smaller) > 1:
                    pending[:0] = smaller
                    continue
            if reply.outcome == "ok":
                outcome.delivered.append(Sent(part, reply))
            elif reply.outcome == "reject":
                outcome.refused.append(Sent(part, reply))
            else:
                outcome.unsent = [part, *(rest for rest, _ in pending)]
                outcome.reply = reply
                break
        return outcome

    def send_combined(
        self,
        run_id: int,
        metrics: Mapping[str, Any],
        actions: Mapping[str, Any],
        *,
        attempts: int | None = None,
    ) -> tuple[Outcome, Outcome]:
        """The outcomes of `metrics` and `actions`, sent in one request when they fit in one (module
        docstring); `attempts` as in `request`."""
        raw = self.encode({"metrics": metrics, "actions": actions}) if self.combined else b""
        if self.combined and len(raw) <= self.max_bytes:
            reply = self._post(f"/runs/{run_id}/{COMBINED_PATH}", raw, attempts)
            halves = _halves(reply)
            if halves is not None:
                return Outcome([Sent(dict(metrics), halves[0])]), Outcome([Sent(dict(actions), halves[1])])
            if _kept_for_later(reply):
                later = [Outcome(unsent=[dict(body)], reply=reply) for body in (metrics, actions)]
                return later[0], later[1]
            if reply.status in (404, 405) and not reply.error_code:  # not this service's own 404
                self.combined = False
            elif reply.status == 413:
                self._learn(reply, len(raw))
        metrics_outcome = self.send(run_id, "metrics", metrics, attempts=attempts)
        if metrics_outcome.unsent:  # the service said "later": the actions wait too, unsent
            return metrics_outcome, Outcome(unsent=[dict(actions)], reply=metrics_outcome.reply)
        return metrics_outcome, self.send(run_id, "actions", actions, attempts=attempts)

    def _post(self, path: str, raw: bytes, attempts: int | None) -> Reply:
        return self.request(
            "POST", path, content=gzip.compress(raw, compresslevel=5), gzipped=True, attempts=attempts
        )

    def _learn(self, reply: Reply, size: int) -> None:
        """A 413: lower the limit to the one the service names (else to half of what it refused)."""
        named = split.limit_from_error(reply.error)
        limit = max(MIN_BODY_BYTES, named if named is not None else size // 2)
        if limit < self.max_bytes:
            self.max_bytes = limit
            if self._on_learn is not None:
                self._on_learn(size, limit)


def _halves(reply: Reply) -> tuple[Reply, Reply] | None:
    """A combined acknowledgement as the two replies the separate endpoints would have given; None if
    `reply` is not one."""
    data = reply.data
    if reply.outcome != "ok" or not isinstance(data, dict):
        return None
    metrics, actions = data.get("metrics"), data.get("actions")
    if not isinstance(metrics, dict) or not isinstance(actions, dict):
        return None
    return replace(reply, data=metrics), replace(reply, data=actions)


def _kept_for_later(reply: Reply) -> bool:
    """An answer about the service, the token or the run, not about the bodies: both halves wait.
    A 409 is about one half's batch id; a 404 without the service's error body is a missing endpoint."""
    if reply.status == 404:
        return bool(reply.error_code)
    return reply.outcome == "retry" and reply.status != 409
