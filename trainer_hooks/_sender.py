"""The sender of `trainer_hooks.client.MonitorClient`: its queue, its daemon thread and the spool.

The client's public methods (the caller's thread, i.e. the training loop) only hand records to
`Sender.submit`, wait in `flush` and stop it with `close`; everything that can take time happens
here, in one daemon thread: registering the run (and fetching its directive; with `prefetch`, first
thing, so that the caller can wait for it: `wait_directive`), coalescing queued
records into batches, sending them (`lldmon_client.Uploader`: retries, the 413 learn-and-split),
spooling what cannot be delivered (`contracts.spool`) and replaying it oldest first once the service
answers again, heartbeats while no batch goes out, and the run's final status at close. The
network state (down since when, until when, why) is the thread's alone; counters and the directive
are read by the caller under the lock.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import httpx

from contracts import spool
from contracts.directive import Directive, parse_directive
from contracts.spool import Outcome, RunIdentity, SpoolEntry
from contracts.wire import encode_json
from lldmon_client import Outcome as SendOutcome
from lldmon_client import Reply, RetryPolicy, Sent, Session, Uploader
from trainer_hooks._announce import say_once
from trainer_hooks._batching import Batch, Record, build_bodies, dumps
from trainer_hooks._warn import WarnOnce, logger

__all__ = ["ClientStats", "RunStatus", "Sender"]

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


class Sender:
    """One run's queue, daemon thread and spool (see the module docstring); `MonitorClient`'s
    arguments of the same names, already checked."""

    def __init__(
        self,
        *,
        url: str,
        identity: RunIdentity,
        spool_dir: Path,
        token: str | None,
        timeout: float,
        transport: httpx.BaseTransport | None,
        retry: RetryPolicy,
        max_queue: int,
        flush_interval: float,
        max_batch_rows: int,
        max_batch_bytes: int,
        spool_max_bytes: int,
        heartbeat_interval: float,
        url_note: str,
        warn: WarnOnce,
        prefetch: bool = False,
    ) -> None:
        self.url, self.identity, self.spool_dir = url, identity, spool_dir
        self._token = token
        self._url_note = url_note
        self._warn = warn
        self._retry = retry
        self._flush_interval = max(0.0, float(flush_interval))
        self._max_batch_rows = max(1, int(max_batch_rows))
        self._spool_max_bytes = int(spool_max_bytes)
        self._overflow_chunk = max(1, min(256, self._max_batch_rows))
        self._heartbeat_interval = max(0.0, float(heartbeat_interval))
        self._last_beat = time.monotonic()  # sender thread: last batch or heartbeat sent

        self.queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, int(max_queue)))
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._submitted = 0
        self._done = 0
        self._overflow: list[Record] = []
        self._stats: dict[str, int] = dict.fromkeys(ClientStats.__dataclass_fields__, 0)
        self._directive = Directive()
        self._prefetch = prefetch
        self._directive_fetched = False  # the run's directive came from the service (GET or an ack)
        self._prefetched = threading.Event()  # the start-up registration and fetch ended, either way
        self._flush_requested = threading.Event()
        self._closing = threading.Event()
        self._close_deadline: float | None = None
        self._net_deadline_at = float("inf")
        self._close_status: RunStatus | None = "finished"
        self._finish_acknowledged = False
        self._sender_exited = False

        # sender-thread state (the uploader's byte limit is read by callers spooling overflow too)
        self._session = Session(
            url, token=token, timeout=timeout, transport=transport, deadline=self._net_deadline
        )
        self._uploader = Uploader(
            self._session,
            retry=retry,
            max_bytes=max_batch_bytes,
            encode=dumps,
            pause=self._sleep,
            on_learn=self._learned_limit,
        )
        self._run_ids: dict[tuple[str | None, str], int] = {}
        self._down_until = 0.0
        self._down_streak = 0
        self._spool_pending = False
        self._spool_writes = 0  # entries written so far (any thread), to notice writes during a replay
        self._auth_refused = False  # the service answered 401/403: `lldmon sync` needs a token
        self._thread = threading.Thread(target=self._run, name="lldmon-sender", daemon=True)

    def start(self) -> None:
        """Start the thread (raises what `Thread.start` raises, e.g. no threads left)."""
        self._thread.start()

    # ---------------------------------------------------------------------------- caller's thread

    @property
    def run_id(self) -> int | None:
        return self._run_ids.get(self.identity.key)

    @property
    def directive(self) -> Directive:
        with self._lock:
            return self._directive

    @property
    def stats(self) -> ClientStats:
        with self._lock:
            return ClientStats(**self._stats)

    def wait_directive(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the start-up registration and directive fetch (`prefetch`);
        whether the service's directive is known now. Ends early when that attempt failed."""
        if self._prefetch:
            self._prefetched.wait(max(0.0, timeout))
        with self._lock:
            return self._directive_fetched

    def flush(self, timeout: float | None) -> bool:
        """Wait until every record submitted so far is acknowledged, rejected or spooled; False if
        `timeout` passed first (or the thread ended with work left)."""
        with self._lock:
            target = self._submitted
        self._flush_requested.set()
        self._wake()
        with self._cond:
            self._cond.wait_for(lambda: self._done >= target or self._sender_exited, timeout)
            return self._done >= target

    def close(self, timeout: float, status: RunStatus | None) -> None:
        """Deliver what is queued, mark the run `status` (None: leave it running, for a job that is
        restarted), stop the thread, all within about `timeout` seconds; what is left then goes to the
        spool, with the final status if the service does not have it."""
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

    def submit(self, record: Record) -> None:
        """Queue `record` and return at once; with the queue full, keep it aside (and spool a chunk
        of those here, in the caller's thread)."""
        with self._lock:
            self._submitted += 1
            self._stats["records"] += 1
        try:
            self.queue.put_nowait(record)
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
            self.queue.put_nowait(_WAKE)

    def _report_leftovers(self, status: RunStatus | None) -> None:
        """After close: what stays in the spool, and how to send it; the run's final status goes
        there too (for `lldmon sync`) unless the service has it and nothing is left."""
        left, size = spool.spool_size(self.spool_dir)
        if status is not None and (left or not self._finish_acknowledged):
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

    # ------------------------------------------------------------------------ either thread

    def _drain_nowait(self) -> list[Record]:
        records: list[Record] = []
        while True:
            try:
                item = self.queue.get_nowait()
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

    def _batches(self, records: list[Record]) -> list[Batch]:
        """Records as ingest bodies of at most `max_batch_rows` rows (not cut to the byte limit yet)."""
        return build_bodies(records, self._max_batch_rows, self._warn)

    def _fit(self, batch: Batch) -> list[Batch]:
        """`batch` cut (if need be) under the current byte limit; parts keep its place in order."""
        parts = self._uploader.split(batch.kind, batch.body)
        return [Batch(batch.kind, body, batch.order_ns + i) for i, (body, _raw) in enumerate(parts)]

    def _learned_limit(self, size: int, limit: int) -> None:
        logger.warning(
            "lldmon: the service refused a %d-byte batch as too large (HTTP 413): "
            "batches are split to at most %d bytes from now on",
            size,
            limit,
        )

    def _spool_records(self, records: list[Record]) -> None:
        try:
            batches = [part for batch in self._batches(records) for part in self._fit(batch)]
        except Exception as exc:
            self._warn(("build", type(exc).__name__), "lldmon: could not encode records: %s", exc)
            return
        for batch in batches:
            self._spool(batch)

    def _spool_fitted(self, batch: Batch) -> None:
        """`batch` to the spool, cut under the current byte limit."""
        for part in self._fit(batch):
            self._spool(part)

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

    # ----------------------------------------------------------------------------- sender thread

    def _run(self) -> None:
        try:
            if self._prefetch:
                self._prefetch_directive()
            self._spool_pending = spool.spool_size(self.spool_dir)[0] > 0
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
                    and self.queue.empty()
                    and not self._overflow
                    and not (self._spool_pending and self._network_allowed())
                ):
                    break
            self._finish_run()
        except Exception as exc:
            self._warn(("sender-fatal", type(exc).__name__), "lldmon: sender stopped: %r", exc)
        finally:
            self._session.close()
            with self._cond:
                self._sender_exited = True
                self._cond.notify_all()

    def _prefetch_directive(self) -> None:
        """Register the run and fetch its directive before anything else (a job resuming an existing
        run trains its first step with the directive the service holds); a failure is handled as any
        registration failure (backoff, spooling), and `wait_directive` stops waiting either way."""
        try:
            self._ensure_registered(self.identity)
        except Exception as exc:
            self._warn(("prefetch", type(exc).__name__), "lldmon: cannot fetch the run's directive: %r", exc)
        finally:
            self._prefetched.set()

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
                item = self.queue.get(timeout=max(0.0, wait))
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
        pair = _step_pair(batches)
        if pair is not None and self._live():
            self._send_live_pair(*pair)
            batches = []
        for batch in batches:
            if self._live():
                self._send_live(batch)
            else:
                self._spool_fitted(batch)
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
        reply = self._session.request("POST", f"/runs/{run_id}/heartbeat")
        if reply.status == 404:  # the service lost the run (a new database): register it again
            self._run_ids.pop(self.identity.key, None)

    # network state

    def _net_deadline(self) -> float:
        """While closing: the time after which nothing goes over the network any more."""
        return self._net_deadline_at

    def _network_allowed(self) -> bool:
        now = time.monotonic()
        return now >= self._down_until and now < self._net_deadline()

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
        reply = self._session.request("POST", "/runs", content=dumps(encode_json(run.register_body())))
        if reply.outcome == "ok" and isinstance(reply.data, dict) and isinstance(reply.data.get("id"), int):
            run_id = int(reply.data["id"])
            self._run_ids[run.key] = run_id
            if self._uploader.adopt_limit(reply.body_limit):
                logger.info(
                    "lldmon: the service accepts at most %d bytes per request: batches are split to it",
                    reply.body_limit,
                )
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
        reply = self._session.request("GET", f"/runs/{run_id}/directive")
        if reply.outcome == "ok":
            self._set_directive(reply.data)

    def _set_directive(self, data: Any) -> None:
        directive = parse_directive(data)
        if directive is not None:
            with self._lock:
                self._directive = directive
                self._directive_fetched = True

    # sending

    def _acknowledged(self, run: RunIdentity, sent: Sent) -> None:
        self._mark_up()
        self._count("duplicates" if sent.duplicate else "sent")
        if run.key == self.identity.key and isinstance(sent.reply.data, dict):
            self._set_directive(sent.reply.data.get("directive"))

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

    def _send_live(self, batch: Batch) -> None:
        """Send with retries (`Uploader`): parts the service refuses go to `rejected/`, and what is
        left after the retry budget (or a keep-for-later answer) to the spool, in order."""
        run_id = self.run_id
        if run_id is None:  # the service lost the run meanwhile: it is registered again later
            self._spool_fitted(batch)
            return
        self._keep_undelivered(batch, self._uploader.send(run_id, batch.kind, batch.body))

    def _send_live_pair(self, metrics: Batch, actions: Batch) -> None:
        """A step's metrics and actions bodies in one request where they fit (`Uploader.send_combined`);
        each half then goes where `_send_live` would put it."""
        run_id = self.run_id
        if run_id is None:
            self._spool_fitted(metrics)
            self._spool_fitted(actions)
            return
        metrics_outcome, actions_outcome = self._uploader.send_combined(run_id, metrics.body, actions.body)
        self._keep_undelivered(metrics, metrics_outcome)
        if actions_outcome.reply is not None and actions_outcome.reply is metrics_outcome.reply:
            actions_outcome.reply = None  # one failed request: noted (and backed off from) once
        self._keep_undelivered(actions, actions_outcome)

    def _live(self) -> bool:
        """Whether a batch goes out now rather than to the spool."""
        return self._network_allowed() and not self._spool_pending and self.run_id is not None

    def _keep_undelivered(self, batch: Batch, outcome: SendOutcome) -> None:
        """Settle `outcome` of `batch`: refused parts to `rejected/`, undelivered ones to the spool."""
        self._settle(self.identity, outcome)
        for i, sent in enumerate(outcome.refused):
            self._spool(Batch(batch.kind, sent.body, batch.order_ns + i), subdir=spool.REJECTED_DIR)
            self._warn_rejected(batch.kind, sent.reply, self.spool_dir / spool.REJECTED_DIR)
        for i, body in enumerate(outcome.unsent):
            self._spool(Batch(batch.kind, body, batch.order_ns + i))

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
        outcome = self._uploader.send(run_id, entry.kind, entry.body, attempts=1)
        self._settle(entry.run, outcome)
        if outcome.verdict == "reject":
            self._warn_rejected(entry.kind, outcome.refused[0].reply, self.spool_dir / spool.REJECTED_DIR)
        elif outcome.verdict == "ok":
            self._count("replayed")
        return outcome.verdict

    def _settle(self, run: RunIdentity, outcome: SendOutcome) -> None:
        """Count what the service acknowledged; remember why the rest was not delivered."""
        for sent in outcome.delivered:
            self._acknowledged(run, sent)
        if outcome.reply is not None:
            self._not_delivered(run, outcome.reply)

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
        if self._close_status is None:  # the job is restarted: the run goes on
            self._finish_acknowledged = True
            return
        if run_id is None or not self._network_allowed():
            return
        reply = self._session.request(
            "POST", f"/runs/{run_id}/finish", content=dumps({"status": self._close_status})
        )
        self._finish_acknowledged = reply.outcome == "ok"
        if reply.outcome != "ok":
            self._warn(
                "finish", "lldmon: could not mark run %s %s: %s", run_id, self._close_status, reply.error
            )


def _step_pair(batches: list[Batch]) -> tuple[Batch, Batch] | None:
    """(metrics, actions) if `batches` are one of each, the usual flush of a step: one request."""
    if len(batches) == 2 and batches[0].kind == "metrics" and batches[1].kind == "actions":
        return batches[0], batches[1]
    return None
