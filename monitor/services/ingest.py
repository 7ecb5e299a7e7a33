"""Ingest: one transaction per batch (run check, ledger entry, rows, run activity), acknowledged after
commit with the run's directive. A metrics batch then runs the detector, whose transaction also reads
the directive it may have just changed: two transactions per metrics batch, one per actions batch."""

from __future__ import annotations

import logging

from monitor.domain import ActionColumns, DirectiveInfo, IngestAck, MetricsColumns, Principal
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
        last_step = max(batch.steps) if batch.steps else None
        with self.telemetry.time_ingest("metrics"), self.db.write() as conn:
            RunService.get_in(conn, principal, run_id)
            previous = ingest_store.claim_batch(conn, run_id, batch_id, "metrics", len(batch))
            if previous is None:
                ingest_store.write_metrics(conn, run_id, batch)
                run_store.touch_run(conn, run_id, last_step)
            else:  # a re-sent batch: nothing new for the detector
                directive = event_store.current_directive(conn, run_id)
        if previous is None:
            directive = self._detect(run_id)
        return self._ack("metrics", batch_id, len(batch), previous, directive, last_step)

    def _detect(self, run_id: int) -> DirectiveInfo:
        """Run the detector over the new steps; the directive after it.

        The batch is committed: a detector failure must not turn its acknowledgement into an error.
        Steps it missed are picked up by the next batch (the window starts at the last processed step).
        """
        try:
            return self.detection.process(run_id)
        except Exception:
            log.exception("detector failed on run %s; will catch up on the next batch", run_id)
        with self.db.read() as conn:
            return event_store.current_directive(conn, run_id)

    def ingest_actions(
        self, principal: Principal, run_id: int, batch_id: str, batch: ActionColumns
    ) -> IngestAck:
        with self.telemetry.time_ingest("actions"), self.db.write() as conn:
            RunService.get_in(conn, principal, run_id)
            previous = ingest_store.claim_batch(conn, run_id, batch_id, "actions", len(batch))
            if previous is None:
                ingest_store.write_actions(conn, run_id, batch)
                run_store.touch_run(conn, run_id, None)
            directive = event_store.current_directive(conn, run_id)
        return self._ack("actions", batch_id, len(batch), previous, directive, None)

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
