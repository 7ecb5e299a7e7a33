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

A job that `lldmon supervise` restarted for a rollback (`trainer_hooks.rollback.resumed()`) resumes a
run whose directive the service already holds (e.g. LLDS on after policy `heal`): its client
registers and fetches that directive before the constructor returns, waiting a few seconds at most,
so the first step it trains again runs with it rather than with the default (LLDS off) until the
first acknowledgement. If the service does not answer in time, one warning, and the default it is.

In multi-process jobs only rank 0 sends: with `enabled=None`, a client is disabled when the
environment variable RANK or LOCAL_RANK is set to anything other than "0"; a disabled client accepts
every call and does nothing (no thread, no HTTP, no files).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import operator
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import httpx

from contracts import split, spool
from contracts.directive import DEFAULT_LLDS_LAMBDA as DEFAULT_LLDS_LAMBDA  # re-exported
from contracts.directive import Directive, Levers, LeverTracker, LLDSDirective
from contracts.spool import RunIdentity
from contracts.wire import DEFAULT_PROJECT, encode_json
from lldmon_client import RetryPolicy, normalize_url
from trainer_hooks._announce import is_rank_zero, say_once, unset_note
from trainer_hooks._batching import Record
from trainer_hooks._sender import ClientStats, RunStatus, Sender
from trainer_hooks._warn import WarnOnce
from trainer_hooks.rollback import requested, resumed

__all__ = ["ClientStats", "Directive", "LLDSDirective", "Levers", "MonitorClient", "RetryPolicy"]

DEFAULT_SPOOL_ROOT: Final = Path("~/.lldmon/spool")
RESUME_DIRECTIVE_WAIT_S: Final = 5.0
"""Longest start-up wait for the run's directive in a job restarted for a rollback: long enough for a
service under load to answer, short next to the minutes a restart (model load, checkpoint) takes."""


def _path_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".") or "_"


def _restarted() -> bool:
    """Whether `lldmon supervise` restarted this job for a rollback (a malformed environment: no)."""
    try:
        return resumed() is not None
    except ValueError:
        return False


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
        directive_wait: seconds the constructor waits for the run's current directive (registration
            and GET /directive, done first by the sender thread), so that the first step trains with
            it. None (default): up to min(`timeout`, `RESUME_DIRECTIVE_WAIT_S`) in a job restarted for
            a rollback (`trainer_hooks.rollback.resumed()`), else 0 (a new run's directive is the
            default anyway). The wait ends early when the service refuses or cannot be reached; a
            directive not known by then is warned about once and stays the default until an
            acknowledgement brings it. Nothing raises.
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
        directive_wait: float | None = None,
        _url_note: str = "",
    ) -> None:
        self._warn = WarnOnce()
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
        self._levers = LeverTracker()
        self._close_lock = threading.Lock()
        self._closed = False
        self._sender: Sender | None = None
        if not self.enabled:
            if enabled is not None and is_rank_zero():  # forced off; other ranks never say anything
                say_once(("off", "enabled=False"), "lldmon: monitoring off: MonitorClient(enabled=False)")
            return
        if directive_wait is None:
            wait = min(float(timeout), RESUME_DIRECTIVE_WAIT_S) if _restarted() else 0.0
        else:
            wait = float(directive_wait) if directive_wait > 0 else 0.0
        sender = Sender(
            url=self.url,
            identity=self.identity,
            spool_dir=self.spool_dir,
            token=token,
            timeout=float(timeout),
            transport=transport,
            retry=retry or RetryPolicy(),
            max_queue=max_queue,
            flush_interval=flush_interval,
            max_batch_rows=max_batch_rows,
            max_batch_bytes=max_batch_bytes,
            spool_max_bytes=spool_max_bytes,
            heartbeat_interval=heartbeat_interval,
            url_note=_url_note,
            warn=self._warn,
            prefetch=wait > 0,
        )
        self._queue = sender.queue  # the bounded queue, for a look at how full it is
        with contextlib.suppress(OSError):  # the run is running (again): an old final status is void
            spool.remove_finish(self.spool_dir, self.identity)
        try:
            sender.start()
            atexit.register(self._at_exit)
        except Exception as exc:  # e.g. no threads left: monitoring off, training goes on
            self.enabled = False
            self._warn("start", "lldmon: client disabled, cannot start its thread: %s", exc)
            say_once(("off", "thread"), f"lldmon: monitoring off: the client cannot start its thread ({exc})")
            return
        self._sender = sender
        if wait > 0:
            self._await_directive(sender, wait)

    def _await_directive(self, sender: Sender, wait: float) -> None:
        """Block for at most `wait` seconds until the sender knows the run's directive (constructor)."""
        try:
            known = sender.wait_directive(wait)
        except Exception as exc:  # never into training
            known = False
            self._warn(("directive-wait", type(exc).__name__), "lldmon: waiting for the directive: %r", exc)
        if not known:
            self._warn(
                "directive-wait",
                "lldmon: no directive for run %r from %s within %g s of start-up: training starts with "
                "the default (LLDS off) until the service answers",
                self.identity.run_name,
                self.url,
                wait,
            )

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
        return None if self._sender is None else self._sender.run_id

    @property
    def directive(self) -> Directive:
        """The latest directive the service sent (default: LLDS off, lam 0.2, version 0, no requests)."""
        return Directive() if self._sender is None else self._sender.directive

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
        return ClientStats() if self._sender is None else self._sender.stats

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Enqueue the metrics of one step and return at once.

        Values are converted with `float()` in the background (Python floats, numpy scalars or
        one-element tensors); NaN and +-inf are sent faithfully; None means "not logged". A step
        logged twice keeps the later value of each name.
        """
        if self._sender is None:
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
        if self._sender is None:
            return
        try:
            self._submit(Record("actions", self._step(step), dict(columns)))
        except Exception as exc:
            self._warn(("log_actions", type(exc).__name__), "lldmon: log_actions() call ignored: %s", exc)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every record logged so far is acknowledged, rejected or spooled.

        Returns False if `timeout` passed first (or the client is closed or disabled with work left).
        """
        if self._sender is None:
            return True
        try:
            return self._sender.flush(timeout)
        except Exception as exc:
            self._warn(("flush", type(exc).__name__), "lldmon: flush() failed: %s", exc)
            return False

    def close(self, timeout: float = 10.0, status: RunStatus | None = "finished") -> None:
        """Flush, mark the run finished (`status`; None: leave it running, for a job that
        `lldmon supervise` restarts), stop the sender. Idempotent, never raises.

        Returns within about `timeout` seconds: what cannot be delivered by then is spooled.
        """
        try:
            with self._close_lock:
                if self._closed:
                    return
                self._closed = True
            with contextlib.suppress(Exception):
                atexit.unregister(self._at_exit)
            if self._sender is not None:
                self._sender.close(timeout, status)
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
        if self._closed or self._sender is None:
            self._warn("after-close", "lldmon: calls after close() are ignored")
            return
        self._sender.submit(record)

    def _at_exit(self) -> None:
        # a job that handed a rollback to `lldmon supervise` is restarted: its run goes on
        try:
            handed_over = requested()
        except Exception:  # at exit, nothing may raise
            handed_over = False
        self.close(status=None if handed_over else "finished")
