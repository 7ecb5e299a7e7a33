"""Liveness: a run whose job went silent (no batch, no heartbeat) is marked `stalled`, then `crashed`.

A killed training job never calls `finish`, so without this its run stays "running, seen N ago"
forever. A background sweeper (one per API process, started with the app) compares each running or
stalled run's silence with its thresholds: past the stall threshold the run becomes `stalled` and a
`run_stalled` warning opens; past the crash threshold it becomes `crashed` and the alert turns
critical. A new batch or a heartbeat revives the run (`running` again, watched again) and the alert
resolves; so it does a run an interrupted import marked `failed`. Only an explicit finish is final.

Thresholds: per run if set (`PUT /runs/{id}/liveness`), otherwise max(`stall_after_seconds`,
`stall_step_factor` x the run's median seconds per step) to stall and `crash_after_factor` times that
to crash, so a run whose steps take 10 minutes is not called stalled between two of them.

Transitions are compare-and-set updates (`store.runs.mark_silent`): with several API workers, each
running a sweeper, exactly one of them raises each alert. Alerts go through `AlertService.raise_alert`
/ `clear_alert`, so they are stored, escalated and delivered like the detector's.
"""

from __future__ import annotations

import logging
import math
import statistics
from datetime import datetime, timezone
from typing import Final

from sqlalchemy import Connection

from contracts.wire import ALERT_RUN_STALLED, RUN_CRASHED, RUN_STALLED
from monitor.config import Settings
from monitor.domain import ActiveCondition, Liveness, Principal
from monitor.errors import InvalidInput, NotFound
from monitor.services.alerts import AlertService
from monitor.services.periodic import Periodic
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import runs as run_store
from monitor.store.runs import RunLiveness

log = logging.getLogger("lldmon.liveness")

MAX_THRESHOLD_S: Final = 366 * 24 * 3600.0
"""A year: longer thresholds are surely a unit mistake (and would overflow date arithmetic)."""


def thresholds(run: RunLiveness, settings: Settings) -> tuple[float, float]:
    """(stall, crash) seconds of silence for `run`: its own values where set, else the defaults."""
    median = statistics.median(run.step_intervals) if run.step_intervals else 0.0
    stall = run.stall_after_s
    if stall is None:
        stall = max(settings.stall_after_seconds, settings.stall_step_factor * median)
    crash = run.crash_after_s
    if crash is None:
        crash = stall * settings.crash_after_factor
    return min(stall, crash), crash


def check_threshold(name: str, value: float | None) -> None:
    """InvalidInput naming `name` unless `value` is None or a positive, finite number of seconds."""
    if value is None:
        return
    if not math.isfinite(value) or not 0 < value <= MAX_THRESHOLD_S:
        raise InvalidInput(f"{name} must be a number of seconds in (0, {MAX_THRESHOLD_S:.0f}]", field=name)


class LivenessService:
    def __init__(self, db: Database, runs: RunService, alerts: AlertService, settings: Settings) -> None:
        self.db = db
        self.runs = runs
        self.alerts = alerts
        self.settings = settings

    # API

    def get(self, principal: Principal, run_id: int) -> Liveness:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return self._liveness(conn, run_id)

    def set_thresholds(
        self, principal: Principal, run_id: int, stall_after_s: float | None, crash_after_s: float | None
    ) -> Liveness:
        """Set (or with None, reset to the defaults) the run's thresholds; the crash one must be longer."""
        check_threshold("stall_after_s", stall_after_s)
        check_threshold("crash_after_s", crash_after_s)
        if stall_after_s is not None and crash_after_s is not None and crash_after_s <= stall_after_s:
            raise InvalidInput("crash_after_s must be longer than stall_after_s", field="crash_after_s")
        self.runs.get(principal, run_id)
        with self.db.write() as conn:
            run_store.set_liveness_thresholds(conn, run_id, stall_after_s, crash_after_s)
            return self._liveness(conn, run_id)

    def heartbeat(self, principal: Principal, run_id: int) -> Liveness:
        """The job is alive between steps: refresh the run and revive it unless it was finished
        explicitly (`store.runs.REVIVABLE`)."""
        self.runs.get(principal, run_id)
        with self.db.write() as conn:
            revived = run_store.heartbeat(conn, run_id)
        if revived:
            self._clear(run_id)
        with self.db.read() as conn:
            return self._liveness(conn, run_id)

    def finished(self, run_id: int) -> None:
        """A run ended with an explicit status: its silence is explained, so a run_stalled alert
        resolves (the sweeper only looks at running and stalled runs)."""
        self._clear(run_id)

    # the sweeper

    def sweep(self, now: datetime | None = None) -> list[tuple[int, str]]:
        """One pass over running and stalled runs; returns the (run id, new status) changes made.

        A running run that still has an open run_stalled alert was revived by a batch (ingest knows
        nothing of liveness alerts): the alert is resolved here."""
        now = now or datetime.now(timezone.utc)
        changes: list[tuple[int, str]] = []
        with self.db.read() as conn:
            live = run_store.liveness(conn)
        alerted = self.alerts.runs_with_open([r.id for r in live], ALERT_RUN_STALLED)
        for run in live:
            stall, crash = thresholds(run, self.settings)
            silent = (now - run.last_seen_at).total_seconds()
            target = RUN_CRASHED if silent >= crash else RUN_STALLED if silent >= stall else None
            if target is None or target == run.status:
                if run.status == "running" and run.id in alerted:
                    self._clear(run.id)
                continue
            with self.db.write() as conn:
                # compare-and-set: seen again meanwhile, or another worker got there first -> no change
                changed = run_store.mark_silent(conn, run.id, run.status, target, run.last_seen_at)
                info = run_store.get_run(conn, run.id)
            if changed and info is not None:
                changes.append((run.id, target))
                log.warning("run %s is %s: no batch or heartbeat for %.0f s", run.id, target, silent)
                self.alerts.raise_alert(info, _condition(run, target, silent, stall, crash))
        return changes

    def _clear(self, run_id: int) -> None:
        with self.db.read() as conn:
            info = run_store.get_run(conn, run_id)
        if info is not None:
            self.alerts.clear_alert(info, ALERT_RUN_STALLED, info.last_step or 0)

    def _liveness(self, conn: Connection, run_id: int) -> Liveness:
        found = run_store.liveness(conn, [run_id])
        if not found:
            raise NotFound(f"run {run_id} does not exist")
        run = found[0]
        stall, crash = thresholds(run, self.settings)
        return Liveness(
            run_id=run.id,
            status=run.status,
            last_seen_at=run.last_seen_at,
            last_step_at=run.last_step_at,
            silent_s=max(0.0, (datetime.now(timezone.utc) - run.last_seen_at).total_seconds()),
            stall_after_s=run.stall_after_s,
            crash_after_s=run.crash_after_s,
            effective_stall_after_s=stall,
            effective_crash_after_s=crash,
            median_step_s=statistics.median(run.step_intervals) if run.step_intervals else None,
        )


def _condition(run: RunLiveness, status: str, silent: float, stall: float, crash: float) -> ActiveCondition:
    crashed = status == RUN_CRASHED
    what = "crashed" if crashed else "stalled"
    return ActiveCondition(
        kind=ALERT_RUN_STALLED,
        severity="critical" if crashed else "warning",
        step=run.last_step or 0,
        message=f"no batch or heartbeat for {silent:.0f} s: marked {what} "
        f"(stall after {stall:g} s, crash after {crash:g} s)",
        evidence={
            "status": status,
            "silent_s": round(silent, 3),
            "stall_after_s": stall,
            "crash_after_s": crash,
            "last_seen_at": run.last_seen_at.isoformat(),
        },
    )


class Sweeper(Periodic):
    """Runs `LivenessService.sweep` every `interval` seconds (`Periodic`)."""

    def __init__(self, service: LivenessService, interval: float) -> None:
        super().__init__("liveness sweep", service.sweep, interval)
        self.service = service
