"""Retention of raw action records (`lldmon db prune`, `LLDMON_ACTIONS_RETENTION`).

Raw action blocks are the bulk of the database; their per-step delta quantiles are what the dashboard's
history needs. Pruning drops a block's payload and keeps its summary, so `GET /actions` has no records
for a pruned step while `GET /actions/summary` still has its quantiles (flagged `pruned`).

With `actions_retention` set, every server process runs a `Pruner`: once at start, then every
`actions_prune_seconds`. The prune is an idempotent UPDATE, so several processes pruning at once only
repeat each other's no-op.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

from monitor.domain import Principal
from monitor.services.periodic import Periodic
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import retention as retention_store
from monitor.store.retention import PruneResult

__all__ = ["PruneResult", "Pruner", "RetentionService"]

log = logging.getLogger("lldmon.retention")


class RetentionService:
    def __init__(self, db: Database, runs: RunService) -> None:
        self.db = db
        self.runs = runs

    def prune_actions(
        self,
        older_than: timedelta,
        run_id: int | None = None,
        *,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> PruneResult:
        """Drop the raw records of action blocks last written more than `older_than` ago (of one run, or
        all); `dry_run` only counts them. An unknown run is NotFound (administrators' call: no scope)."""
        if run_id is not None:
            self.runs.get(Principal(), run_id)
        cutoff = (now or datetime.now(timezone.utc)) - older_than
        if dry_run:
            with self.db.read() as conn:
                return retention_store.count_prunable(conn, cutoff, run_id)
        with self.db.write() as conn:
            return retention_store.prune_actions(conn, cutoff, run_id)


class Pruner(Periodic):
    """Prunes by `retention` at start and then every `interval` seconds (`Periodic`)."""

    def __init__(self, service: RetentionService, retention: timedelta, interval: float) -> None:
        super().__init__("retention", self.prune_once, interval, at_start=True)
        self.service = service
        self.retention = retention

    def prune_once(self) -> PruneResult | None:
        """One pass; None if it failed (logged; the next interval retries)."""
        try:
            result = self.service.prune_actions(self.retention)
        except Exception:  # a database hiccup must not end retention (or the server)
            log.exception("pruning action records failed; retrying in %s s", self.interval)
            return None
        if result.blocks:
            log.info(
                "pruned %d action blocks (%d records) older than %s",
                result.blocks,
                result.records,
                self.retention,
            )
        return result
