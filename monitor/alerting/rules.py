"""Pure alert rules: which findings open, refresh, re-notify, escalate or resolve alerts (no I/O).

One alert per (run, kind) at a time. A finding that is still active refreshes its open alert and is
re-notified at most every `renotify_after` (never while acknowledged, unless its severity rises: then
it is sent as `escalated`). An open alert whose condition is no longer active is resolved: the run
recovered. A warning whose kind gives way to a critical kind that supersedes it (`lld_decay` ->
`lld_collapse`) did not recover: it is closed silently and the critical alert is sent as `escalated`.

A caller judges only the kinds it owns (`kinds`): the detector does not resolve another source's alert
(a liveness `run_stalled`), and that source does not resolve the detector's.

Hysteresis: a condition that flickers (active, cleared, active again a few steps later) is one alert,
not one per episode. When a kind with no unresolved alert becomes active again at most `hold_steps`
steps after the run's latest alert of that kind resolved, that alert continues (re-opened, its
`reopen_count` raised) instead of a new one opening, and nothing is sent: receivers already know it. Only
a rise in severity is sent (`escalated`). Its next resolution is sent only if something was sent since
the last one (`OpenAlert.last_event`), so a flicker costs one `firing` and one `resolved`, and the
regular re-notification still reminds of an alert that stays open.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from contracts.alerts import ESCALATED, FIRING, RESOLVED, SEVERITY_RANK
from monitor.detector import findings as F
from monitor.domain import ActiveCondition, OpenAlert, ResolvedAlert

__all__ = [
    "ESCALATIONS",
    "ActiveCondition",
    "AlertPlan",
    "OpenAlert",
    "Refresh",
    "Reopen",
    "ResolvedAlert",
    "plan_alerts",
]

ESCALATIONS: Final[Mapping[str, Collection[str]]] = {
    F.LLD_DECAY: (F.LLD_COLLAPSE, F.TRAINING_COLLAPSE),
}
"""Warning kind -> the critical kinds it turns into when the run gets worse (phase II -> phase III)."""


@dataclass(frozen=True)
class Refresh:
    alert_id: int
    condition: ActiveCondition
    notify: bool
    event: str = FIRING
    """`escalated` when the severity rose."""
    previous_severity: str | None = None


@dataclass(frozen=True)
class Reopen:
    """A resolved alert whose condition came back within the hold: it continues with `condition`."""

    alert: ResolvedAlert
    condition: ActiveCondition
    status: str
    """`acknowledged` if it was acknowledged before it resolved, else `open`."""

    @property
    def raises_severity(self) -> bool:
        return _rank(self.condition.severity) > _rank(self.alert.severity)


@dataclass
class AlertPlan:
    create: list[ActiveCondition] = field(default_factory=list)
    reopen: list[Reopen] = field(default_factory=list)
    refresh: list[Refresh] = field(default_factory=list)
    resolve: list[OpenAlert] = field(default_factory=list)
    superseded: list[tuple[OpenAlert, str]] = field(default_factory=list)
    """(open warning, created or re-opened kind that escalates it): closed without a `resolved`
    notification."""

    def escalates(self, kind: str) -> OpenAlert | None:
        """The warning a created (or re-opened) kind escalates, if any (its notification is then
        `escalated`)."""
        return next((alert for alert, successor in self.superseded if successor == kind), None)

    @staticmethod
    def announces_resolution(alert: OpenAlert) -> bool:
        """Whether resolving `alert` is sent: not when the last thing sent about it already said
        `resolved` (it re-opened silently since)."""
        return alert.last_event != RESOLVED


def plan_alerts(
    open_alerts: Sequence[OpenAlert],
    active: Sequence[ActiveCondition],
    *,
    now: datetime,
    renotify_after: timedelta,
    kinds: Collection[str] | None = None,
    escalations: Mapping[str, Collection[str]] = ESCALATIONS,
    resolved: Sequence[ResolvedAlert] = (),
    hold_steps: int | None = None,
) -> AlertPlan:
    """`kinds`: the alert kinds this caller judges (None: all); other open alerts are left alone.
    `resolved`: the run's latest resolved alert of each kind (older ones are ignored); one whose kind is
    active again with its condition starting at most `hold_steps` steps after its `resolved_step`
    continues instead of a new alert (None: never)."""
    plan = AlertPlan()
    mine = [a for a in open_alerts if kinds is None or a.kind in kinds]
    by_kind = {a.kind: a for a in mine}
    latest: dict[str, ResolvedAlert] = {}
    for r in resolved:
        if (kinds is None or r.kind in kinds) and (r.kind not in latest or r.id > latest[r.kind].id):
            latest[r.kind] = r
    active_kinds = set()
    for condition in active:
        if condition.kind in active_kinds:
            continue
        active_kinds.add(condition.kind)
        existing = by_kind.get(condition.kind)
        if existing is None:
            previous = latest.get(condition.kind)
            if previous is not None and _within_hold(previous, condition, hold_steps):
                status = "acknowledged" if previous.acknowledged else "open"
                plan.reopen.append(Reopen(previous, condition, status))
            else:
                plan.create.append(condition)
            continue
        escalated = _rank(condition.severity) > _rank(existing.severity)
        due = existing.last_notified_at is None or now - existing.last_notified_at >= renotify_after
        notify = escalated or (existing.status == "open" and due)
        event, previous_severity = (ESCALATED, existing.severity) if escalated else (FIRING, None)
        plan.refresh.append(Refresh(existing.id, condition, notify, event, previous_severity))
    gone = [a for a in mine if a.kind not in active_kinds]
    arrived = {c.kind: c for c in [*plan.create, *(r.condition for r in plan.reopen)]}
    for alert in gone:
        successor = next((k for k in escalations.get(alert.kind, ()) if k in arrived), None)
        if successor is not None and _rank(arrived[successor].severity) > _rank(alert.severity):
            plan.superseded.append((alert, successor))
        else:
            plan.resolve.append(alert)
    return plan


def _within_hold(previous: ResolvedAlert, condition: ActiveCondition, hold_steps: int | None) -> bool:
    if hold_steps is None or previous.resolved_step is None:
        return False
    return condition.step - previous.resolved_step <= hold_steps


def _rank(severity: str) -> int:
    return SEVERITY_RANK.get(severity, 0)
