"""Pure alert rules: which findings open, refresh, re-notify, escalate or resolve alerts (no I/O).

One alert per (run, kind) at a time. A finding that is still active refreshes its open alert and is
re-notified at most every `renotify_after` (never while acknowledged, unless its severity rises: then
it is sent as `escalated`). An open alert whose condition is no longer active is resolved: the run
recovered. A warning whose kind gives way to a critical kind that supersedes it (`lld_decay` ->
`lld_collapse`) did not recover: it is closed silently and the critical alert is sent as `escalated`.

A caller judges only the kinds it owns (`kinds`): the detector does not resolve another source's alert
(a liveness `run_stalled`), and that source does not resolve the detector's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from contracts.alerts import ESCALATED, FIRING, SEVERITY_RANK
from monitor.detector import findings as F
from monitor.domain import ActiveCondition, OpenAlert

__all__ = ["ESCALATIONS", "ActiveCondition", "AlertPlan", "OpenAlert", "Refresh", "plan_alerts"]

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


@dataclass
class AlertPlan:
    create: list[ActiveCondition] = field(default_factory=list)
    refresh: list[Refresh] = field(default_factory=list)
    resolve: list[OpenAlert] = field(default_factory=list)
    superseded: list[tuple[OpenAlert, str]] = field(default_factory=list)
    """(open warning, created kind that escalates it): closed without a `resolved` notification."""

    def escalates(self, kind: str) -> OpenAlert | None:
        """The warning a created kind escalates, if any (its notification is then `escalated`)."""
        return next((alert for alert, successor in self.superseded if successor == kind), None)


def plan_alerts(
    open_alerts: Sequence[OpenAlert],
    active: Sequence[ActiveCondition],
    *,
    now: datetime,
    renotify_after: timedelta,
    kinds: Collection[str] | None = None,
    escalations: Mapping[str, Collection[str]] = ESCALATIONS,
) -> AlertPlan:
    """`kinds`: the alert kinds this caller judges (None: all); other open alerts are left alone."""
    plan = AlertPlan()
    mine = [a for a in open_alerts if kinds is None or a.kind in kinds]
    by_kind = {a.kind: a for a in mine}
    active_kinds = set()
    for condition in active:
        if condition.kind in active_kinds:
            continue
        active_kinds.add(condition.kind)
        existing = by_kind.get(condition.kind)
        if existing is None:
            plan.create.append(condition)
            continue
        escalated = _rank(condition.severity) > _rank(existing.severity)
        due = existing.last_notified_at is None or now - existing.last_notified_at >= renotify_after
        notify = escalated or (existing.status == "open" and due)
        event, previous = (ESCALATED, existing.severity) if escalated else (FIRING, None)
        plan.refresh.append(Refresh(existing.id, condition, notify, event, previous))
    gone = [a for a in mine if a.kind not in active_kinds]
    created = {c.kind: c for c in plan.create}
    for alert in gone:
        successor = next((k for k in escalations.get(alert.kind, ()) if k in created), None)
        if successor is not None and _rank(created[successor].severity) > _rank(alert.severity):
            plan.superseded.append((alert, successor))
        else:
            plan.resolve.append(alert)
    return plan


def _rank(severity: str) -> int:
    return SEVERITY_RANK.get(severity, 0)
