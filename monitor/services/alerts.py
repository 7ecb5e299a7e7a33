"""Alerts as users see them: list and acknowledge (the detector opens and resolves them)."""

from __future__ import annotations

from collections.abc import Sequence

from monitor.domain import AlertInfo, Principal, RunInfo
from monitor.errors import NotFound
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import alerts as alert_store


class AlertService:
    def __init__(self, db: Database, runs: RunService) -> None:
        self.db = db
        self.runs = runs

    def list(self, principal: Principal, run_id: int, status: str | None = None) -> list[AlertInfo]:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return alert_store.list_alerts(conn, run_id, status)

    def unresolved_counts(self, runs: Sequence[RunInfo]) -> dict[int, int]:
        """Open or acknowledged alerts of each run (0 if none), in one query. `runs` must come from
        `RunService.list` / `get` for the same principal: that is where access was checked."""
        ids = [r.id for r in runs]
        with self.db.read() as conn:
            counts = alert_store.unresolved_counts(conn, ids)
        return {run_id: counts.get(run_id, 0) for run_id in ids}

    def acknowledge(self, principal: Principal, run_id: int, alert_id: int) -> AlertInfo:
        """Stop re-notifications of an open alert; it still resolves when the run recovers."""
        self.runs.get(principal, run_id)
        with self.db.write() as conn:
            if not alert_store.acknowledge(conn, run_id, alert_id):
                alert = alert_store.get(conn, alert_id)
                if alert is None or alert.run_id != run_id:
                    raise NotFound(f"run {run_id} has no alert {alert_id}")
            alert = alert_store.get(conn, alert_id)
        assert alert is not None
        return alert
