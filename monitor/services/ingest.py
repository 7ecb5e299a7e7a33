"""Ingest: one transaction per batch (run check, ledger entry, rows, run activity), acknowledged after
commit with the run's directive. A metrics batch then runs the detector, whose transaction also reads
the directive it may have just changed: two transactions per metrics batch, one per actions batch
(a metrics batch of more than `DetectionService.chunk_points` new steps gets one detector transaction
per chunk). A combined request (`ingest_combined`) is a metrics batch whose transaction also claims and
writes an actions batch.

The ledger is keyed by (run, kind, batch id) and keeps a digest of the decoded payload: a re-sent batch
is a duplicate only if its payload is the same; the same id with another payload is a 409, since
acknowledging it would silently drop data.

A metrics batch may carry the trainer's acknowledgement of directive versions (`directive/applied_version`,
contracts.directive). It is judged here, in the batch's transaction, against the versions that exist
then, and recorded on the versions it covers (`event_store.acknowledge`); the values stay stored as
metrics either way. A value that is not a whole number from 1 to the run's current version is ignored,
not clamped: the trainer is out of step with this run's directives (a bug, or values copied from another
run), so it shows nothing about the versions that do exist, and counting them acknowledged would make
every trainer skip their checkpoint and stop requests for good (stop-on-collapse included), while an
ignored value leaves them pending for the trainer to act on. Imports (`IMPORT_BATCH_PREFIX`) are
history and acknowledge nothing.

A metrics batch that carries `directive/rollback_to` (`contracts.directive.ROLLBACK_METRIC`, logged by a
trainer that restored a checkpoint for a rollback request) rolls the run's history back before the
batch is written, in its transaction: the metrics and action records after the restored step go (their
steps are being trained again), the phase events after it move to the rollback's record, and the
detector is put back to where it stood at that step (`DetectionService.rewind`); the rollback is
recorded from the run's last step to the restored one. A value that is not a whole number below its
own step, or not below the run's last step, changes nothing."""

from __future__ import annotations

import hashlib
import logging
import math

import msgspec
from sqlalchemy import Connection

from contracts.directive import APPLIED_VERSION_METRIC, ROLLBACK_METRIC
from contracts.wire import IMPORT_BATCH_PREFIX
from monitor.domain import ActionColumns, DirectiveInfo, IngestAck, MetricsColumns, Principal
from monitor.errors import Conflict
from monitor.services.auth import accessible_run
from monitor.services.detection import DetectionService
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import events as event_store
from monitor.store import ingest as ingest_store
from monitor.store import runs as run_store
from monitor.telemetry import ServiceMetrics

log = logging.getLogger("lldmon.ingest")


class IngestService:
    def __init__(
        self, db: Database, runs: RunService, telemetry: ServiceMetrics, detection: DetectionService
    ) -> None:
        self.db = db
        self.runs = runs
        self.telemetry = telemetry
        self.detection = detection

    def ingest_metrics(
        self, principal: Principal, run_id: int, batch_id: str, batch: MetricsColumns
    ) -> IngestAck:
        with self.telemetry.time_ingest("metrics"), self.db.write() as conn:
            run = _batch_run(conn, principal, run_id)
            previous = self._store_metrics(conn, run, run_id, batch_id, batch)
            if previous is not None:  # a re-sent batch: nothing new for the detector
                directive = event_store.current_directive(conn, run_id)
        if previous is None:
            directive = self._detect(run_id)
        return self._ack("metrics", batch_id, len(batch), previous, directive, _last_step(batch))

    def ingest_combined(
        self,
        principal: Principal,
        run_id: int,
        metrics: tuple[str, MetricsColumns],
        actions: tuple[str, ActionColumns],
    ) -> tuple[IngestAck, IngestAck]:
        """A metrics batch and an actions batch in one transaction (one request of the trainer per
        step instead of two): each claimed under its own kind and batch id, so a re-send of either
        through its own endpoint (the client's spool) is a duplicate of this one, and either may be a
        duplicate here. The metrics are stored first (a rollback they carry truncates the history the
        actions then continue); the detector runs once, after the commit, if the metrics were new."""
        (metrics_id, metrics_batch), (actions_id, actions_batch) = metrics, actions
        with self.telemetry.time_ingest("combined"), self.db.write() as conn:
            run = _batch_run(conn, principal, run_id)
            metrics_previous = self._store_metrics(conn, run, run_id, metrics_id, metrics_batch)
            actions_previous = self._store_actions(
                conn, run if metrics_previous is not None else None, run_id, actions_id, actions_batch
            )
            if metrics_previous is not None:
                directive = event_store.current_directive(conn, run_id)
        if metrics_previous is None:
            directive = self._detect(run_id)
        return (
            self._ack(
                "metrics",
                metrics_id,
                len(metrics_batch),
                metrics_previous,
                directive,
                _last_step(metrics_batch),
            ),
            self._ack("actions", actions_id, len(actions_batch), actions_previous, directive, None),
        )

    def _store_metrics(
        self,
        conn: Connection,
        run: run_store.RunActivity,
        run_id: int,
        batch_id: str,
        batch: MetricsColumns,
    ) -> int | None:
        """Claim and write a metrics batch and record the run's activity; `_claim`'s answer."""
        previous = _claim(conn, run_id, "metrics", batch_id, batch, len(batch))
        if previous is None:
            live = not batch_id.startswith(IMPORT_BATCH_PREFIX)
            rolled_back = live and self._roll_back(conn, run_id, run.last_step, batch)
            ingest_store.write_metrics(conn, run_id, batch)
            if live:
                _record_acknowledgements(conn, run_id, batch)
            seen = None if rolled_back else run
            first_step = min(batch.steps) if batch.steps else None
            run_store.touch_run(conn, run_id, _last_step(batch), seen, first_step=first_step)
        return previous

    def _roll_back(
        self, conn: Connection, run_id: int, run_last_step: int | None, batch: MetricsColumns
    ) -> bool:
        """Roll the run's history back to the checkpoint the batch says the trainer restored (module
        docstring); whether it did."""
        to_step = rollback_target(batch)
        if to_step is None or run_last_step is None or to_step >= run_last_step:
            return False
        version = event_store.current_directive(conn, run_id).rollback
        ingest_store.truncate_history(conn, run_id, to_step)
        event_store.record_rollback(conn, run_id, run_last_step, to_step, version)
        self.detection.rewind(conn, run_id, to_step)
        log.info("run %s rolled back from step %d to step %d", run_id, run_last_step, to_step)
        return True

    def judge_backlog(self, run_id: int) -> DirectiveInfo:
        """Judge every step not judged yet (a batch over the detector's per-batch bound leaves some):
        at an import's end and a run's finish, which have no next batch to do it."""
        return self._detect(run_id, catch_up=True)

    def _detect(self, run_id: int, *, catch_up: bool = False) -> DirectiveInfo:
        """Run the detector over the new steps; the directive after it.

        The batch is committed: a detector failure must not turn its acknowledgement into an error.
        Steps it missed are picked up by the next batch (the window starts at the last processed step).
        """
        try:
            return self.detection.process(run_id, catch_up=catch_up)
        except Exception:
            log.exception("detector failed on run %s; will catch up on the next batch", run_id)
        with self.db.read() as conn:
            return event_store.current_directive(conn, run_id)

    def ingest_actions(
        self, principal: Principal, run_id: int, batch_id: str, batch: ActionColumns
    ) -> IngestAck:
        with self.telemetry.time_ingest("actions"), self.db.write() as conn:
            run = _batch_run(conn, principal, run_id)
            previous = self._store_actions(conn, run, run_id, batch_id, batch)
            directive = event_store.current_directive(conn, run_id)
        return self._ack("actions", batch_id, len(batch), previous, directive, None)

    @staticmethod
    def _store_actions(
        conn: Connection,
        run: run_store.RunActivity | None,
        run_id: int,
        batch_id: str,
        batch: ActionColumns,
    ) -> int | None:
        """Claim and write an actions batch; `_claim`'s answer. `run`: the run as read for the
        activity update, None if this transaction recorded the activity already."""
        previous = _claim(conn, run_id, "actions", batch_id, batch, len(batch))
        if previous is None:
            ingest_store.write_actions(conn, run_id, batch)
            if run is not None:
                run_store.touch_run(conn, run_id, None, run)
        return previous

    def _ack(
        self,
        kind: str,
        batch_id: str,
        rows: int,
        previous: int | None,
        directive: DirectiveInfo,
        last_step: int | None,
    ) -> IngestAck:
        duplicate = previous is not None
        self.telemetry.record_batch(kind, rows=0 if duplicate else rows, duplicate=duplicate)
        return IngestAck(
            batch_id=batch_id,
            rows=previous if previous is not None else rows,
            duplicate=duplicate,
            directive=directive,
            last_step=last_step,
        )


def _last_step(batch: MetricsColumns) -> int | None:
    return max(batch.steps) if batch.steps else None


def _batch_run(conn: Connection, principal: Principal, run_id: int) -> run_store.RunActivity:
    """The batch's run, read once for both the access check and the activity update (`touch_run`)."""
    return accessible_run(principal, run_id, lambda i: run_store.read_activity(conn, i))


def _record_acknowledgements(conn: Connection, run_id: int, batch: MetricsColumns) -> None:
    """Record the batch's directive acknowledgements that name a version existing now (module docstring)."""
    if APPLIED_VERSION_METRIC not in batch.names:
        return
    current = event_store.latest_version(conn, run_id)
    event_store.acknowledge(conn, run_id, _acknowledgements(batch, current))


def _acknowledgements(batch: MetricsColumns, current_version: int) -> list[tuple[int, int]]:
    """The batch's (step, version) acknowledgements in step order, each above the ones before it, of
    the values that are whole numbers from 1 to `current_version` (NaN, +-inf, fractions, 0, negatives
    and versions that do not exist yet are ignored)."""
    values = sorted(
        (step, float(value))
        for name, step, value in zip(batch.names, batch.steps, batch.values, strict=True)
        if name == APPLIED_VERSION_METRIC and value is not None
    )
    accepted: list[tuple[int, int]] = []
    highest = 0
    for step, value in values:
        if math.isfinite(value) and value.is_integer() and highest < value <= current_version:
            highest = int(value)
            accepted.append((step, highest))
    return accepted


def rollback_target(batch: MetricsColumns) -> int | None:
    """The restored step a batch reports (`ROLLBACK_METRIC`; the last valid one if several): a whole
    number from 0 to below the step it is logged at; None: none."""
    if ROLLBACK_METRIC not in batch.names:  # every live batch comes here: no row loop without one
        return None
    found = None
    for name, step, value in zip(batch.names, batch.steps, batch.values, strict=True):
        if name != ROLLBACK_METRIC or value is None or not math.isfinite(value):
            continue
        if value.is_integer() and 0 <= value < step:
            found = int(value)
    return found


def payload_digest(batch: MetricsColumns | ActionColumns) -> str:
    """SHA-256 of the decoded batch (msgpack keeps +-inf and None apart, unlike JSON), so that a
    re-send is recognised whatever its JSON spelling (tokens or strings, spacing, gzip)."""
    return hashlib.sha256(msgspec.msgpack.encode(batch)).hexdigest()


def _claim(
    conn: Connection, run_id: int, kind: str, batch_id: str, batch: MetricsColumns | ActionColumns, rows: int
) -> int | None:
    """None for a new batch; the rows first acknowledged for a re-send of the same payload."""
    digest = payload_digest(batch)
    previous = ingest_store.claim_batch(conn, run_id, kind, batch_id, digest, rows)
    if previous is None:
        return None
    if previous.digest is not None and previous.digest != digest:
        raise Conflict(
            f"{kind} batch {batch_id!r} was already received with a different payload; "
            "a new batch needs a new batch_id",
            field="batch_id",
        )
    return previous.n_rows
