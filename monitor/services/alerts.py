"""The alerting service: alerts as users see them (list, acknowledge) and the one owner of plan -> store
-> notify. Sources of conditions (the detector inside its transaction, liveness checks) hand them to
`judge` / `raise_alert` / `clear_alert`; this service plans with the pure rules
(`monitor.alerting.rules`), writes the alert rows and hands what is due to the dispatcher, so no
source calls the alert store or the sinks itself.

An alert's `first_step` is the step its condition started at and its `last_step` the last step the
condition was seen to hold (it moves on with every judged batch while the alert is open and stays
there when it resolves; `resolved_step` is where it was judged cleared). A detector finding that comes
back within `hold_steps` of its alert's resolution continues that alert (`monitor.alerting.rules`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import Connection

from contracts.alerts import ESCALATED, FIRING, RESOLVED
from monitor.alerting.rules import plan_alerts
from monitor.alerting.sinks import Dispatcher, Notification
from monitor.domain import (
    ActiveCondition,
    AlertInfo,
    DeliveryUpdate,
    OpenAlert,
    Principal,
    ResolvedAlert,
    RunInfo,
)
from monitor.errors import NotFound
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import alerts as alert_store
from monitor.telemetry import ServiceMetrics

DEFAULT_RENOTIFY = timedelta(hours=1)
DEFAULT_HOLD_STEPS = 20
"""Steps after an alert resolved within which its finding coming back continues it. On the 27 lab
fixtures (one point per step) `reward_zero` came back 61 times: 54 times 4 steps after it cleared and 3
more times within 20, while the other returns were 24 to 101 steps apart; 20 steps also spans the
windows (5 to 20 steps) of most threshold findings, whose statistic can wobble around its threshold."""
Notifications = list[Notification]
"""(`AlertService` has a method named `list`.)"""


@dataclass(frozen=True)
class AlertRun:
    """The run an alert is about, as notifications name it."""

    run_id: int
    name: str
    project: str
    phase: str | None = None


def _notification(
    event: str,
    alert_id: int,
    run: AlertRun,
    c: ActiveCondition,
    previous_severity: str | None = None,
    *,
    first_step: int | None = None,
    last_step: int | None = None,
    reopen_count: int = 0,
) -> Notification:
    return Notification(
        event=event,
        alert_id=alert_id,
        run_id=run.run_id,
        run_name=run.name,
        project=run.project,
        kind=c.kind,
        severity=c.severity,
        step=c.step,
        message=c.message,
        evidence=c.evidence,
        phase=run.phase,
        previous_severity=previous_severity,
        first_step=c.step if first_step is None else first_step,
        last_step=c.last_held if last_step is None else last_step,
        reopen_count=reopen_count,
    )


class DeliveryLog:
    """The dispatcher's `DeliveryRecorder`: stores delivery state per alert and sink, one short
    transaction per call (from the sinks' worker threads, never inside an ingest transaction)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def __call__(self, updates: Sequence[DeliveryUpdate]) -> None:
        with self.db.write() as conn:
            alert_store.record_deliveries(conn, updates)


class AlertService:
    def __init__(
        self,
        db: Database,
        runs: RunService,
        dispatcher: Dispatcher | None = None,
        *,
        renotify_after: timedelta = DEFAULT_RENOTIFY,
        hold_steps: int = DEFAULT_HOLD_STEPS,
        telemetry: ServiceMetrics | None = None,
    ) -> None:
        self.db = db
        self.runs = runs
        self.dispatcher = dispatcher
        self.renotify_after = renotify_after
        self.hold_steps = hold_steps
        self.telemetry = telemetry

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

    def raise_alert(self, run: RunInfo, condition: ActiveCondition) -> Notifications:
        """Open (or refresh, escalate, re-notify) the run's alert of `condition.kind` from outside the
        detector (a liveness check's `run_stalled`) and send what is due through the sinks. Only that
        kind is judged, and the detector never resolves it: `clear_alert` does."""
        return self._apply(run, [condition], condition.kind, condition.step)

    def clear_alert(self, run: RunInfo, kind: str, step: int) -> Notifications:
        """Resolve the run's open alert of `kind` at `step` (notified as resolved); none open: nothing."""
        return self._apply(run, [], kind, step)

    def runs_with_open(self, run_ids: Collection[int], kind: str) -> set[int]:
        """Those of `run_ids` with an unresolved alert of `kind` (one read transaction)."""
        with self.db.read() as conn:
            return {
                run_id
                for run_id in run_ids
                if any(a.kind == kind for a in alert_store.open_alerts(conn, run_id))
            }

    def judge(
        self,
        conn: Connection,
        run: AlertRun,
        active: Sequence[ActiveCondition],
        *,
        kinds: Collection[str] | None = None,
        last_step: int | None = None,
        now: datetime | None = None,
        hysteresis: bool = True,
    ) -> Notifications:
        """Open, continue, refresh, escalate and resolve the run's alerts of `kinds` (None: all) so they
        match the `active` conditions, in the caller's transaction, which must hold the run's lock
        (`store.detection.lock_run` / `store.alerts.lock_run`); returns what to `notify` once it has
        committed. `last_step`: the step judged last (alerts resolve there; default: the latest step
        an active condition held). `hysteresis`: a kind that comes back within `hold_steps` of its
        alert's resolution continues that alert."""
        now = now or datetime.now(timezone.utc)
        unresolved = alert_store.open_alerts(conn, run.run_id)
        hold = self.hold_steps if hysteresis else None
        resolved: list[ResolvedAlert] = []
        if hold is not None:
            returning = {c.kind for c in active if kinds is None or c.kind in kinds}
            resolved = alert_store.latest_resolved(conn, run.run_id, returning - {a.kind for a in unresolved})
        plan = plan_alerts(
            unresolved,
            active,
            now=now,
            renotify_after=self.renotify_after,
            kinds=kinds,
            resolved=resolved,
            hold_steps=hold,
        )
        step = last_step if last_step is not None else max((c.last_held for c in active), default=0)
        notes: Notifications = []
        for alert, _successor in plan.superseded:  # closed without a "resolved": the run got worse
            alert_store.resolve(conn, alert.id, step, now, announced=False)
        for condition in plan.create:
            warning = plan.escalates(condition.kind)
            event = FIRING if warning is None else ESCALATED
            alert_id = alert_store.create(conn, run.run_id, condition, now, event)
            if self.telemetry is not None:
                self.telemetry.record_alert(condition.severity, condition.kind)
            notes.append(
                _notification(event, alert_id, run, condition, None if warning is None else warning.severity)
            )
        for reopen in plan.reopen:  # the same alert goes on; receivers hear of it only if it got worse
            warning = plan.escalates(reopen.condition.kind)
            previous = warning.severity if warning is not None else reopen.alert.severity
            sent = ESCALATED if warning is not None or reopen.raises_severity else None
            continued = alert_store.reopen(conn, reopen.alert.id, reopen.condition, reopen.status, now, sent)
            if continued and sent is not None:
                notes.append(
                    _notification(
                        sent,
                        reopen.alert.id,
                        run,
                        reopen.condition,
                        previous,
                        first_step=reopen.alert.first_step,
                        reopen_count=reopen.alert.reopen_count + 1,
                    )
                )
        by_id = {a.id: a for a in unresolved}
        quiet = [(r.alert_id, r.condition) for r in plan.refresh if not r.notify]
        alert_store.refresh_quietly(conn, quiet, now)
        for refresh in plan.refresh:
            if refresh.notify:
                alert_store.refresh(conn, refresh.alert_id, refresh.condition, now, refresh.event)
                was = by_id[refresh.alert_id]
                notes.append(
                    _notification(
                        refresh.event,
                        refresh.alert_id,
                        run,
                        refresh.condition,
                        refresh.previous_severity,
                        first_step=was.first_step,
                        last_step=max(refresh.condition.last_held, was.last_step or 0),
                        reopen_count=was.reopen_count,
                    )
                )
        for alert in plan.resolve:
            announced = plan.announces_resolution(alert)
            if alert_store.resolve(conn, alert.id, step, now, announced) and announced:
                notes.append(_resolved(alert, run, step))
        return notes

    def notify(self, notes: Notifications) -> None:
        """Hand committed notifications to the sinks (never blocks: each sink has its own worker)."""
        if self.dispatcher is not None and notes:
            self.dispatcher.submit(notes)

    def _apply(self, run: RunInfo, active: Sequence[ActiveCondition], kind: str, step: int) -> Notifications:
        """Judge one kind from outside the detector, without hysteresis: a liveness condition is about
        wall-clock silence, during which the run's step does not move, so a hold in steps means nothing
        there and a second stall is news."""
        with self.db.write() as conn:
            alert_store.lock_run(conn, run.id)
            notes = self.judge(
                conn,
                AlertRun(run.id, run.name, run.project, run.phase),
                active,
                kinds={kind},
                last_step=step,
                hysteresis=False,
            )
        self.notify(notes)
        return notes


def _resolved(alert: OpenAlert, run: AlertRun, step: int) -> Notification:
    cleared = ActiveCondition(alert.kind, alert.severity, step, "condition cleared", {})
    return _notification(
        RESOLVED,
        alert.id,
        run,
        cleared,
        first_step=alert.first_step,
        last_step=alert.last_step,
        reopen_count=alert.reopen_count,
    )
