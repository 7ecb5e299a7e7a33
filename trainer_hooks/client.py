"""Stream step metrics and action records from a training job to the lldmon service.

    client = MonitorClient("http://lldmon:8000", "grpo-3b-nq", project="nq", config=cfg)
    for step in ...:
        client.log(step, measurement.metrics)              # enqueue only, returns at once
        client.log_actions(step, measurement.actions)      # columns as in contracts.wire
        if client.directive.llds.enabled:
            llds_lambda = client.directive.llds.lam
        levers = client.take_levers(step)                  # checkpoint / stop requests, once each
    client.close()                                         # also registered with atexit

Monitoring never slows down or crashes training: `log()` / `log_actions()` only put a record on a
bounded queue and return; nothing raises out of `log()`, `log_actions()`, `flush()` or `close()`.
One daemon thread registers the run, coalesces queued records into columnar batches (gzip, one
uuid4 `batch_id` each, stable across retries) and sends them. Transient failures (connection
errors, timeouts, 408/429/5xx) are retried with exponential backoff and jitter, honouring
Retry-After, up to `RetryPolicy.attempts`; then the batch goes to the on-disk spool
(`contracts.spool`) and, while the service stays unreachable, further batches go straight there.
When the service answers again the spool is replayed oldest first (in the order the data was
logged), before newer batches; leftovers of a previous process are replayed on start. A batch the
service refuses as invalid (4xx other than 401/403/404/408/409/429) is never retried: it is logged
once and kept in `<spool>/rejected/`. A batch is never larger than `max_batch_bytes` of JSON (split
by steps, or by metric names) and one the service refuses as too large (413) is split further
with the limit the service names, never filed as rejected. Because batch ids are stable and the
service keeps a batch ledger, nothing is stored twice. If the queue is full, the caller's thread
spools the overflow itself (in chunks) instead of blocking. `lldmon sync DIR` uploads a spool that
a job left behind, and applies the run's final status that `close()` leaves there when it could not
tell the service.

In multi-process jobs only rank 0 sends: with `enabled=None`, a client is disabled when the
environment variable RANK or LOCAL_RANK is set to anything other than "0"; a disabled client accepts
every call and does nothing (no thread, no HTTP, no files).
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import json
import operator
import os
import queue
import re
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

import httpx

from contracts import split, spool
from contracts.directive import DEFAULT_LLDS_LAMBDA as DEFAULT_LLDS_LAMBDA  # re-exported
from contracts.directive import Directive, Levers, LeverTracker, LLDSDirective, parse_directive
from contracts.spool import Outcome, RunIdentity, SpoolEntry
from contracts.wire import API_PREFIX, DEFAULT_PROJECT, encode_json
from trainer_hooks._announce import is_rank_zero, say_once, unset_note
from trainer_hooks._batching import Batch, Kind, Record, build_bodies, dumps
from trainer_hooks._transport import HttpSession, Reply, RetryPolicy
from trainer_hooks._warn import WarnOnce, logger

__all__ = ["ClientStats", "Directive", "LLDSDirective", "Levers", "MonitorClient", "RetryPolicy"]

DEFAULT_SPOOL_ROOT: Final = Path("~/.lldmon/spool")
_REPLAY_SLICE_S: Final = 2.0
"""Longest stretch of spool replay before the sender drains its queue again."""
_WAKE: Final = object()

RunStatus = Literal["finished", "failed", "crashed"]


@dataclass(frozen=True)
class ClientStats:
    """Counters since the client started (batches unless named otherwise)."""

    sent: int = 0
    """Acknowledged as new by the service (live or replayed)."""
    duplicates: int = 0
    """Acknowledged as already stored (a retry after a lost acknowledgement)."""
    replayed: int = 0
    """Sent from the spool (included in `sent` / `duplicates`)."""
    spooled: int = 0
    rejected: int = 0
    dropped: int = 0
    """Lost: deleted by the spool size limit, or the spool could not be written."""
    records: int = 0
    """log() / log_actions() calls accepted."""


def _path_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".") or "_"


def _json_safe(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """Plain JSON with odd values as `str()` and NaN / +-inf as the wire's strings, so the register
    body encodes with or without orjson (json refuses non-finite floats, orjson writes `null`)."""
    if not value:
        return {}
    try:
        result = encode_json(json.loads(json.dumps(dict(value), default=str)))
    except (TypeError, ValueError, RecursionError):
        return {"config": str(value)}
    return result if isinstance(result, dict) else {}


def _did_you_mean(url: str) -> str:
    return f" (did you mean {url!r}?)"


def _origin(parts: urllib.parse.SplitResult) -> str:
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def normalize_url(url: str) -> str:
    """The service's base URL: "http(s)://host[:port]", without a trailing "/api/v1".

    The only path accepted is the API's own, "/api/v1" (behind a proxy that serves the service under
    a prefix: "<prefix>/api/v1", kept as the base "<prefix>"). Any other path is a page of the service,
    not its base: the dashboard URL the demo prints would send every batch to a 405 and into the
    spool for the whole run.

    Raises ValueError naming the problem and, where the intended URL is plain, suggesting it: a URL
    the client cannot reach would otherwise be retried in the background for the whole run while
    every batch piles up in the spool.
    """
    text = str(url).strip()
    hint = ""
    if text and "://" not in text:
        hint = _did_you_mean(f"http://{text}")
        with contextlib.suppress(ValueError):
            guess = urllib.parse.urlsplit(f"http://{text}")
            if guess.hostname:
                hint = _did_you_mean(_origin(guess))
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError as exc:
        raise ValueError(f"lldmon URL {url!r} is not valid: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"lldmon URL must look like http://host:port, got {url!r}{hint}")
    if parts.query or parts.fragment:
        raise ValueError(
            f"lldmon URL must not have a query or fragment, got {url!r}{_did_you_mean(_origin(parts))}"
        )
    path = parts.path.rstrip("/")
    if path.endswith(API_PREFIX):
        path = path[: -len(API_PREFIX)].rstrip("/")
    elif path:
        raise ValueError(
            f"lldmon URL must look like http://host:port, without a path, got {url!r}"
            f"{_did_you_mean(_origin(parts))}"
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class MonitorClient:
    """Streams metrics of one run to an lldmon service (see the module docstring).

    Args:
        url: base URL of the service, e.g. "http://127.0.0.1:8000" (a trailing "/api/v1" is
            accepted); ValueError if it is not an http(s) URL.
        run_name: the run's name; the run is registered (get-or-create) by (project, run_name).
        project: project name (None: the token's project, else "default").
        token: API token (`lldmon token create`), sent as a Bearer token.
        config, tags: stored with the run (config is made JSON-safe with `str()` for odd values).
        spool_dir: where undeliverable batches go; default ~/.lldmon/spool/<project>/<run_name>.
        max_queue: records (calls) the queue holds before the caller spools overflow itself.
        flush_interval: seconds the sender coalesces records before sending a batch.
        max_batch_rows: steps per metrics batch, records per action batch.
        max_batch_bytes: JSON bytes per request (before gzip); larger batches are split. Lowered
            automatically to the limit a service names in a 413.
        spool_max_bytes: size limit of the spool; the oldest batches are deleted first.
        timeout: seconds per HTTP request.
        heartbeat_interval: seconds between heartbeats while no batch goes out (a long step), so the
            service does not mark the run stalled; 0 disables them.
        enabled: None = auto (off on ranks other than 0), or force on / off.
        transport: an httpx transport (tests pass `httpx.MockTransport`).
        retry: retry and backoff settings (`RetryPolicy`).
    """

    def __init__(
        self,
        url: str,
        run_name: str,
        *,
        project: str | None = None,
        token: str | None = None,
        config: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        max_queue: int = 10_000,
        flush_interval: float = 1.0,
        max_batch_rows: int = 5000,
        max_batch_bytes: int = split.DEFAULT_MAX_BODY_BYTES,
        spool_max_bytes: int = 256 * 1024 * 1024,
        timeout: float = 10.0,
        enabled: bool | None = None,
        transport: httpx.BaseTransport | None = None,
        retry: RetryPolicy | None = None,
        heartbeat_interval: float = 60.0,
        _url_note: str = "",
    ) -> None:
        self._warn = WarnOnce()
        self._url_note = _url_note
        self.url = normalize_url(url)
        self.identity = RunIdentity(
            run_name=str(run_name),
            project=project,
            config=_json_safe(config),
            tags=tuple(str(t) for t in (tags or ())),
        )
        if spool_dir is None:
            spool_dir = (
                DEFAULT_SPOOL_ROOT / _path_part(project or DEFAULT_PROJECT) / _path_part(str(run_name))
            )
        self.spool_dir = Path(spool_dir).expanduser()
        self.enabled = is_rank_zero() if enabled is None else bool(enabled)
        self._token = token
        self._timeout = float(timeout)
        self._transport = transport
        self._retry = retry or RetryPolicy()
        self._flush_interval = max(0.0, float(flush_interval))
        self._max_batch_rows = max(1, int(max_batch_rows))
        self._max_batch_bytes = max(1024, int(max_batch_bytes))
        self._spool_max_bytes = int(spool_max_bytes)
        self._overflow_chunk = max(1, min(256, self._max_batch_rows))
        self._heartbeat_interval = max(0.0, float(heartbeat_interval))
        self._last_beat = time.monotonic()  # sender thread: last batch or heartbeat sent

        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, int(max_queue)))
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._submitted = 0
        self._done = 0
        self._overflow: list[Record] = []
        self._stats: dict[str, int] = dict.fromkeys(ClientStats.__dataclass_fields__, 0)
        self._directive = Directive()
        self._levers = LeverTracker()
        self._flush_requested = threading.Event()
        self._closing = threading.Event()
        self._close_deadline: float | None = None
        self._net_deadline_at = float("inf")
        self._close_status: RunStatus = "finished"
        self._finish_acknowledged = False
        self._closed = False
        self._sender_exited = False

        # sender-thread state
        self._session: HttpSession | None = None
        self._run_ids: dict[tuple[str | None, str], int] = {}
        self._down_until = 0.0
        self._down_streak = 0
        self._spool_pending = False
        self._spool_writes = 0  # entries written so far (any thread), to notice writes during a replay
        self._auth_refused = False  # the service answered 401/403: `lldmon sync` needs a token

        self._thread: threading.Thread | None = None
        if not self.enabled:
            if enabled is not None and is_rank_zero():  # forced off; other ranks never say anything
                say_once(("off", "enabled=False"), "lldmon: monitoring off: MonitorClient(enabled=False)")
            return
        with contextlib.suppress(OSError):  # the run is running (again): an old final status is void
            spool.remove_finish(self.spool_dir, self.identity)
        try:
            self._thread = threading.Thread(target=self._run, name="lldmon-sender", daemon=True)
            self._thread.start()
            atexit.register(self._at_exit)
        except Exception as exc:  # e.g. no threads left: monitoring off, training goes on
            self._thread = None
            self.enabled = False
            self._warn("start", "lldmon: client disabled, cannot start its thread: %s", exc)
            say_once(("off", "thread"), f"lldmon: monitoring off: the client cannot start its thread ({exc})")

    @classmethod
    def from_env(
        cls,
        run: str | None = None,
        *,
        project: str | None = None,
        config: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> MonitorClient:
        """A client configured like the trackers people know (W&B's `WANDB_*`): from the environment.

        `LLDMON_URL` (default "http://127.0.0.1:8000"), `LLDMON_TOKEN`, `LLDMON_PROJECT` and
        `LLDMON_RUN` fill what the arguments leave unset (an argument wins over the environment).
        Without any run name the run is called "run-<UTC time>-<pid>". Other keyword arguments go to
        the constructor. Without `LLDMON_URL` the start line says the default URL is used, naming a
        variable that looks like a misspelling of it (`LLDMON_ULR`, `lldmon_url`, ...).
        """
        env = os.environ if environ is None else environ
        url = env.get("LLDMON_URL", "").strip()
        if not url:
            url = "http://127.0.0.1:8000"
            kwargs.setdefault("_url_note", f"; {unset_note('LLDMON_URL', env)}: using the default {url}")
        try:
            url = normalize_url(url)
        except ValueError as exc:
            raise ValueError(f"LLDMON_URL: {exc}") from None
        run_name = run or env.get("LLDMON_RUN", "").strip()
        if not run_name:
            run_name = f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}"
        kwargs.setdefault("token", env.get("LLDMON_TOKEN", "").strip() or None)
        return cls(
            url,
            run_name,
            project=project or env.get("LLDMON_PROJECT", "").strip() or None,
            config=config,
            **kwargs,
        )

    # ------------------------------------------------------------------------------------ public API

    @property
    def run_id(self) -> int | None:
        """The service's id of this run, once registered."""
        return self._run_ids.get(self.identity.key)

    @property
    def directive(self) -> Directive:
        """The latest directive the service sent (default: LLDS off, lam 0.2, version 0, no requests)."""
        with self._lock:
            return self._directive

    def take_levers(self, step: int) -> Levers:
        """What a plain training loop should do at `step`, each request once: `checkpoint` (save now),
        `stop` (save and end training, `stop_reason` says why). The directive's version is
        acknowledged with this step's metrics (`directive/applied_version`), so call it where the loop
        acts on the result::

            levers = client.take_levers(step)
            if levers.checkpoint or levers.stop:
                save_checkpoint(step)
            if levers.stop:
                break
        """
        if not self.enabled:
            return Levers()
        levers = self._levers.take(self.directive)
        if levers.acknowledge is not None:
            self.log(step, levers.metrics())
        return levers

    @property
    def stats(self) -> ClientStats:
        with self._lock:
            return ClientStats(**self._stats)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Enqueue the metrics of one step and return at once.

        Values are converted with `float()` in the background (Python floats, numpy scalars or
        one-element tensors); NaN and +-inf are sent faithfully; None means "not logged". A step
        logged twice keeps the later value of each name.
        """
        if not self.enabled:
            return
        try:
            self._submit(Record("metrics", self._step(step), dict(metrics)))
        except Exception as exc:
            self._warn(("log", type(exc).__name__), "lldmon: log() call ignored: %s", exc)

    def log_actions(self, step: int, columns: Mapping[str, Any]) -> None:
        """Enqueue per-action records (columns of one length) and return at once.

        `columns` maps names of `contracts.wire.ACTION_COLUMNS` to sequences (lists, numpy arrays
        or tensors): `traj_index`, `action_index`, `n_tokens`, `delta`, `is_answer` are required;
        `step` defaults to `step`, `source` to "loss" (or one string for all rows), and
        `old_logp_mean`, `advantage`, `reward` to null. `StepMeasurement.actions` fits as it is.
        """
        if not self.enabled:
            return
        try:
            self._submit(Record("actions", self._step(step), dict(columns)))
        except Exception as exc:
            self._warn(("log_actions", type(exc).__name__), "lldmon: log_actions() call ignored: %s", exc)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every record logged so far is acknowledged, rejected or spooled.

        Returns False if `timeout` passed first (or the client is closed or disabled with work left).
        """
        if not self.enabled:
            return True
        try:
            with self._lock:
                target = self._submitted
            self._flush_requested.set()
            self._wake()
            with self._cond:
                self._cond.wait_for(lambda: self._done >= target or self._sender_exited, timeout)
                return self._done >= target
        except Exception as exc:
            self._warn(("flush", type(exc).__name__), "lldmon: flush() failed: %s", exc)
            return False

    def close(self, timeout: float = 10.0, status: RunStatus = "finished") -> None:
        """Flush, mark the run finished (`status`), stop the sender. Idempotent, never raises.

        Returns within about `timeout` seconds: what cannot be delivered by then is spooled.
        """
        try:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
            with contextlib.suppress(Exception):
                atexit.unregister(self._at_exit)
            if self._thread is None:
                return
            self._close_status = status
            timeout = max(0.0, float(timeout))
            self._close_deadline = time.monotonic() + timeout
            # network work stops a little earlier, leaving time to spool what is left
            self._net_deadline_at = self._close_deadline - min(1.0, 0.2 * timeout)
            self._closing.set()
            self._wake()
            self._thread.join(max(0.0, self._close_deadline - time.monotonic()))
            if self._thread.is_alive():
                self._warn("close-timeout", "lldmon: sender still busy after close(timeout=%s)", timeout)
            self._spool_leftovers()
            self._report_leftovers(status)
        except Exception as exc:
            self._warn(("close", type(exc).__name__), "lldmon: close() failed: %s", exc)

    def __enter__(self) -> MonitorClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(status="finished" if exc_type is None else "failed")

    # ------------------------------------------------------------------------------ caller's thread

    @staticmethod
    def _step(step: int) -> int:
        value = operator.index(step)
        if value < 0:
            raise ValueError(f"step must be >= 0, got {value}")
        return value

    def _submit(self, record: Record) -> None:
        if self._closed:
            self._warn("after-close", "lldmon: calls after close() are ignored")
            return
        with self._lock:
            self._submitted += 1
            self._stats["records"] += 1
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._overflow_add(record)

    def _overflow_add(self, record: Record) -> None:
        """Queue full: keep the record aside; every `_overflow_chunk` records, spool them here."""
        with self._lock:
            self._overflow.append(record)
            if len(self._overflow) < self._overflow_chunk:
                return
            chunk, self._overflow = self._overflow, []
        self._warn("queue-full", "lldmon: send queue full, spooling records to %s", self.spool_dir)
        try:
            self._spool_records(chunk)
        finally:
            self._mark_done(len(chunk))

    def _wake(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_WAKE)

    def _at_exit(self) -> None:
        self.close()

    def _report_leftovers(self, status: RunStatus) -> None:
        """After close: what stays in the spool, and how to send it; the run's final status goes
        there too (for `lldmon sync`) unless the service has it and nothing is left."""
        left, size = spool.spool_size(self.spool_dir)
        if left or not self._finish_acknowledged:
            spool.write_finish(self.spool_dir, self.identity, status)
        if left:
            logger.warning(
                "lldmon: %d batches (%d bytes) of run %r stay in the spool %s; send them with "
                "`lldmon sync %s --url %s%s` (the next client of this run on this spool sends them too)",
                left,
                size,
                self.identity.run_name,
                self.spool_dir,
                self.spool_dir,
                self.url,
                " --token $LLDMON_TOKEN" if self._token or self._auth_refused else "",
            )

    def _spool_leftovers(self) -> None:
        """After close: whatever is still queued (logged during close, or a stuck sender) to disk."""
        records = self._drain_nowait()
        if records:
            try:
                self._spool_records(records)
            finally:
                self._mark_done(len(records))

    # ------------------------------------------------------------------------------- shared helpers

    def _drain_nowait(self) -> list[Record]:
        records: list[Record] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Record):
                records.append(item)
        with self._lock:
            records += self._overflow
            self._overflow = []
        return records

    def _mark_done(self, n: int) -> None:
        if n:
            with self._cond:
                self._done += n
                self._cond.notify_all()

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats[name] += n

    def _batches(self, records: list[Record]) -> list[tuple[Batch, bytes]]:
        """Records as ingest bodies of at most `max_batch_rows` rows and `max_batch_bytes` of JSON,
        each with its encoding."""
        return [
            part
            for batch in build_bodies(records, self._max_batch_rows, self._warn)
            for part in self._fit(batch)
        ]

    def _fit(self, batch: Batch) -> list[tuple[Batch, bytes]]:
        """`batch` split (if need be) under the current byte limit; parts keep its place in order."""
        parts = split.split_body(batch.kind, batch.body, self._max_batch_bytes, dumps)
        return [(Batch(batch.kind, body, batch.order_ns + i), raw) for i, (body, raw) in enumerate(parts)]

    def _adopt_limit(self, limit: int | None) -> None:
        """The body limit the service announces (`MAX_BODY_HEADER`): split under it before sending,
        so no batch of ours is refused with a 413."""
        if limit is not None and limit < self._max_batch_bytes:
            self._max_batch_bytes = max(1024, limit)
            logger.info(
                "lldmon: the service accepts at most %d bytes per request: batches are split to it", limit
            )

    def _learn_limit(self, reply: Reply, size: int) -> None:
        """A 413: lower the byte limit to the one the service names (else to half of what it refused)."""
        named = split.limit_from_error(reply.error)
        limit = named if named is not None else size // 2
        if limit < self._max_batch_bytes:
            self._max_batch_bytes = max(1024, limit)
            logger.warning(
                "lldmon: the service refused a %d-byte batch as too large (HTTP 413): "
                "batches are split to at most %d bytes from now on",
                size,
                self._max_batch_bytes,
            )

    def _spool_records(self, records: list[Record]) -> None:
        try:
            batches = self._batches(records)
        except Exception as exc:
            self._warn(("build", type(exc).__name__), "lldmon: could not encode records: %s", exc)
            return
        for batch, _raw in batches:
            self._spool(batch)

    def _spool(self, batch: Batch, subdir: str | None = None) -> None:
        directory = self.spool_dir / subdir if subdir else self.spool_dir
        entry = SpoolEntry(run=self.identity, kind=batch.kind, body=batch.body)
        try:
            report = spool.write_entry(
                directory, entry, max_bytes=self._spool_max_bytes, order_ns=batch.order_ns
            )
        except Exception as exc:
            with self._lock:
                self._stats["dropped"] += 1
                total = self._stats["dropped"]
            logger.warning(  # every time: the batch is lost for good
                "lldmon: cannot write spool %s, a batch is lost: %s; %d batches dropped so far",
                directory,
                exc,
                total,
            )
            return
        if subdir is None:
            with self._lock:
                self._stats["spooled"] += 1
                self._spool_writes += 1
            if report.kept:
                self._spool_pending = True
        if report.dropped_batches:
            with self._lock:
                self._stats["dropped"] += report.dropped_batches
                total = self._stats["dropped"]
            logger.warning(  # every time: each one is data lost for good
                "lldmon: spool %s over its limit of %d bytes: dropped the %d oldest batches (%d bytes); "
                "%d batches dropped so far",
                directory,
                self._spool_max_bytes,
                report.dropped_batches,
                report.dropped_bytes,
                total,
            )

    # ------------------------------------------------------------------------------- sender thread

    def _run(self) -> None:
        try:
            self._spool_pending = spool.spool_size(self.spool_dir)[0] > 0
            self._session = HttpSession(
                self.url, token=self._token, timeout=self._timeout, transport=self._transport
            )
            final_attempt = False
            while True:
                records: list[Record] = []
                try:
                    records = self._collect()
                    if self._closing.is_set() and not final_attempt:
                        final_attempt = True
                        self._down_until = 0.0  # one more try at close, whatever the backoff
                    self._deliver(records)
                except Exception as exc:
                    self._warn(("sender", type(exc).__name__), "lldmon: sender error: %r", exc)
                    self._mark_down(f"{type(exc).__name__}: {exc}")
                    self._spool_records(records)
                finally:
                    self._mark_done(len(records))
                if (
                    self._closing.is_set()
                    and self._queue.empty()
                    and not self._overflow
                    and not (self._spool_pending and self._network_allowed())
                ):
                    break
            self._finish_run()
        except Exception as exc:
            self._warn(("sender-fatal", type(exc).__name__), "lldmon: sender stopped: %r", exc)
        finally:
            if self._session is not None:
                self._session.close()
            with self._cond:
                self._sender_exited = True
                self._cond.notify_all()

    def _collect(self) -> list[Record]:
        """Records to send now: what arrives within `flush_interval` of the first one (or at once
        on flush/close), up to `max_batch_rows`; [] after an idle `flush_interval`."""
        records: list[Record] = []
        first_at: float | None = None
        while True:
            if self._flush_requested.is_set() or self._closing.is_set():
                self._flush_requested.clear()
                return records + self._drain_nowait()
            now = time.monotonic()
            if first_at is not None:
                wait = first_at + self._flush_interval - now
                if wait <= 0 or len(records) >= self._max_batch_rows:
                    return records + self._take_overflow()
            elif self._spool_pending and now >= self._down_until:
                wait = 0.05  # catching up on the spool
            else:
                wait = max(0.05, self._flush_interval)
            try:
                item = self._queue.get(timeout=max(0.0, wait))
            except queue.Empty:
                if first_at is None:
                    return self._take_overflow()
                continue
            if isinstance(item, Record):
                records.append(item)
                if first_at is None:
                    first_at = time.monotonic()

    def _take_overflow(self) -> list[Record]:
        with self._lock:
            records, self._overflow = self._overflow, []
        return records

    def _deliver(self, records: list[Record]) -> None:
        registered = self._network_allowed() and self._ensure_registered(self.identity) is not None
        batches = self._batches(records) if records else []  # after registering: its answer names the limit
        if registered and self._spool_pending:
            self._replay_spool()
        for batch, raw in batches:
            if self._network_allowed() and not self._spool_pending and self.run_id is not None:
                self._send_live(batch, raw)
            else:
                self._spool(batch)
        if batches:
            self._last_beat = time.monotonic()
        elif registered:
            self._heartbeat()

    def _heartbeat(self) -> None:
        """A light `POST /runs/{id}/heartbeat` every `heartbeat_interval` while no batch goes out. Best
        effort and quiet: a failure only means the next batch (or beat) tells the service we live."""
        run_id = self.run_id
        now = time.monotonic()
        if not self._heartbeat_interval or run_id is None or self._closing.is_set():
            return
        if now - self._last_beat < self._heartbeat_interval:
            return
        self._last_beat = now
        assert self._session is not None
        reply = self._session.request("POST", f"/runs/{run_id}/heartbeat", timeout=self._request_timeout())
        if reply.status == 404:  # the service lost the run (a new database): register it again
            self._run_ids.pop(self.identity.key, None)

    # network state

    def _net_deadline(self) -> float:
        """While closing: the time after which nothing goes over the network any more."""
        return self._net_deadline_at

    def _network_allowed(self) -> bool:
        now = time.monotonic()
        return now >= self._down_until and now < self._net_deadline()

    def _request_timeout(self) -> float:
        return max(0.05, min(self._timeout, self._net_deadline() - time.monotonic()))

    def _mark_down(self, reason: str, long: bool = False) -> None:
        delay = self._retry.backoff_max if long else self._retry.backoff(self._down_streak)
        self._down_streak += 1
        self._down_until = time.monotonic() + delay
        self._warn(
            ("down", reason.split(":")[0]),
            "lldmon: cannot deliver to %s (%s); spooling to %s and retrying in the background",
            self.url,
            reason,
            self.spool_dir,
        )

    def _mark_up(self) -> None:
        if self._down_streak:
            logger.info("lldmon: %s reachable again", self.url)
        self._down_streak = 0
        self._down_until = 0.0

    def _sleep(self, delay: float) -> bool:
        """Sleep before a retry; False (without sleeping) if that would pass the close deadline."""
        end = time.monotonic() + delay
        if end > self._net_deadline():
            return False
        if self._closing.wait(delay):  # closing started: the deadline is known now
            if end > self._net_deadline():
                return False
            time.sleep(max(0.0, end - time.monotonic()))
        return True

    # run registration

    def _ensure_registered(self, run: RunIdentity) -> int | None:
        run_id = self._run_ids.get(run.key)
        if run_id is not None:
            return run_id
        assert self._session is not None
        reply = self._session.request(
            "POST", "/runs", content=dumps(encode_json(run.register_body())), timeout=self._request_timeout()
        )
        if reply.outcome == "ok" and isinstance(reply.data, dict) and isinstance(reply.data.get("id"), int):
            run_id = int(reply.data["id"])
            self._run_ids[run.key] = run_id
            self._adopt_limit(reply.body_limit)
            self._mark_up()
            if run.key == self.identity.key:
                self._announce(run_id, "")
                self._fetch_directive(run_id)
            return run_id
        self._note_auth(reply)
        if run.key == self.identity.key:
            self._announce(None, self._failure(reply))
        if reply.outcome == "reject" or reply.status in (401, 403):
            self._warn(
                ("register", reply.status, reply.error_code),
                "lldmon: the service refused to register run %r (HTTP %s): %s",
                run.run_name,
                reply.status,
                reply.error,
            )
            self._mark_down(f"HTTP {reply.status}", long=True)
        else:
            self._mark_down(reply.error or f"HTTP {reply.status}")
        return None

    def _announce(self, run_id: int | None, failure: str) -> None:
        """The start line (`trainer_hooks._announce`): registered (id and dashboard page), or on with
        spooling and why not registered; printed by the first registration attempt only."""
        name = self.identity.run_name
        if run_id is not None:
            line = f"lldmon: monitoring on: run {name!r} (id {run_id}), dashboard {self.url}/dashboard/run/{run_id}"
        else:
            line = (
                f"lldmon: monitoring on, but run {name!r} is not registered yet ({failure}): "
                f"spooling to {self.spool_dir} and retrying in the background"
            )
        say_once(("on", self.url, self.identity.key), line + self._url_note)

    def _failure(self, reply: Reply) -> str:
        """Why a request failed, on one short line."""
        if reply.status is None:
            return f"{self.url} did not answer: {reply.error}"
        error = " ".join(reply.error.split())
        error = error if len(error) <= 160 else error[:157] + "..."
        return f"{self.url} answered HTTP {reply.status}" + (f": {error}" if error else "")

    def _note_auth(self, reply: Reply) -> None:
        if reply.status in (401, 403):
            self._auth_refused = True

    def _fetch_directive(self, run_id: int) -> None:
        assert self._session is not None
        reply = self._session.request("GET", f"/runs/{run_id}/directive", timeout=self._request_timeout())
        if reply.outcome == "ok":
            self._set_directive(reply.data)

    def _set_directive(self, data: Any) -> None:
        directive = parse_directive(data)
        if directive is not None:
            with self._lock:
                self._directive = directive

    # sending

    def _post(self, run_id: int, kind: Kind, payload: bytes) -> Reply:
        assert self._session is not None
        return self._session.request(
            "POST", f"/runs/{run_id}/{kind}", content=payload, gzipped=True, timeout=self._request_timeout()
        )

    def _acknowledged(self, run: RunIdentity, reply: Reply) -> None:
        self._mark_up()
        data = reply.data if isinstance(reply.data, dict) else {}
        self._count("duplicates" if data.get("duplicate") else "sent")
        if run.key == self.identity.key:
            self._set_directive(data.get("directive"))

    def _warn_rejected(self, kind: str, reply: Reply, where: Path) -> None:
        self._count("rejected")
        self._warn(
            ("rejected", kind, reply.status, reply.error_code),
            "lldmon: the service rejected a %s batch (HTTP %s): %s; not retried, kept in %s",
            kind,
            reply.status,
            reply.error,
            where,
        )

    def _not_delivered(self, run: RunIdentity, reply: Reply) -> None:
        """A kept-for-later answer: remember why, and back off."""
        if reply.status == 404:  # the run is unknown to the service (e.g. a new database)
            self._run_ids.pop(run.key, None)
        self._note_auth(reply)
        self._mark_down(reply.error or f"HTTP {reply.status}", long=not reply.transient)

    def _send_live(self, batch: Batch, raw: bytes) -> None:
        """Send with retries; spool after the retry budget (or a non-transient keep-for-later).

        A 413 lowers the byte limit and sends the batch in parts; only a batch that cannot be cut
        any further (one value) is filed as rejected."""
        run, kind = self.identity, batch.kind
        payload = gzip.compress(raw, compresslevel=5)
        reply = Reply(status=None)
        for attempt in range(max(1, self._retry.attempts)):
            run_id = self.run_id
            if run_id is None:
                break
            reply = self._post(run_id, kind, payload)
            if reply.outcome == "ok":
                self._acknowledged(run, reply)
                return
            if reply.status == 413:
                self._learn_limit(reply, len(raw))
                parts = self._fit(batch)
                if len(parts) > 1:
                    for part, part_raw in parts:
                        self._send_live(part, part_raw)
                    return
            if reply.outcome == "reject":
                self._spool(batch, subdir=spool.REJECTED_DIR)
                self._warn_rejected(kind, reply, self.spool_dir / spool.REJECTED_DIR)
                return
            if not reply.transient or attempt + 1 >= self._retry.attempts:
                break
            if reply.retry_after is not None:
                delay = min(reply.retry_after, self._retry.max_retry_after)
            else:
                delay = self._retry.backoff(attempt)
            if not self._sleep(delay):
                break
        self._spool(batch)
        self._not_delivered(run, reply)

    def _send_spooled(self, entry: SpoolEntry) -> Outcome:
        """Transport of `contracts.spool.replay`: one attempt per part, no retry loop.

        An entry over the byte limit (spooled before a 413 lowered it, or by an older client) goes
        in parts; their batch ids derive from the entry's, so a replay cut short and repeated
        re-sends the same parts (duplicates on the service, nothing stored twice)."""
        if not self._network_allowed():
            return "retry"
        run_id = self._ensure_registered(entry.run)
        if run_id is None:
            return "retry"
        pending = split.split_body(entry.kind, entry.body, self._max_batch_bytes, dumps)
        while pending:
            body, raw = pending.pop(0)
            reply = self._post(run_id, entry.kind, gzip.compress(raw, compresslevel=5))
            if reply.status == 413:
                self._learn_limit(reply, len(raw))
                parts = split.split_body(entry.kind, body, self._max_batch_bytes, dumps)
                if len(parts) > 1:
                    pending[:0] = parts
                    continue
            if reply.outcome == "ok":
                self._acknowledged(entry.run, reply)
                continue
            if reply.outcome == "reject":
                self._warn_rejected(entry.kind, reply, self.spool_dir / spool.REJECTED_DIR)
            else:
                self._not_delivered(entry.run, reply)
            return reply.outcome
        self._count("replayed")
        return "ok"

    def _replay_spool(self) -> None:
        start = time.monotonic()

        def should_stop() -> bool:
            return time.monotonic() - start > _REPLAY_SLICE_S or not self._network_allowed()

        writes_before = self._spool_writes
        report = spool.replay(
            self.spool_dir,
            self._send_spooled,
            should_stop=should_stop,
            rejected_max_bytes=self._spool_max_bytes,
        )
        self._spool_pending = report.remaining > 0 or self._spool_writes != writes_before
        if report.error:
            self._mark_down(report.error)

    def _finish_run(self) -> None:
        run_id = self.run_id
        if run_id is None or not self._network_allowed() or self._session is None:
            return
        reply = self._session.request(
            "POST",
            f"/runs/{run_id}/finish",
            content=dumps({"status": self._close_status}),
            timeout=self._request_timeout(),
        )
        self._finish_acknowledged = reply.outcome == "ok"
        if reply.outcome != "ok":
            self._warn(
                "finish", "lldmon: could not mark run %s %s: %s", run_id, self._close_status, reply.error
            )
