"""Pure alert rules: which findings open, refresh, re-notify or resolve alerts (no I/O).

One alert per (run, kind) at a time. A finding that is still active refreshes its open alert and is
re-notified at most every `renotify_after` (never while acknowledged, unless its severity rises).
An open alert whose condition is no longer active is resolved: the run recovered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class ActiveCondition:
    """What the detector says is wrong at a step (mirrors `monitor.detector.Finding`)."""

    kind: str
    severity: str
    step: int
    message: str
    evidence: dict[str, Any]


@dataclass(frozen=True)
class OpenAlert:
    id: int
    kind: str
    severity: str
    status: str  # "open" | "acknowledged"
    last_notified_at: datetime | None


@dataclass(frozen=True)
class Refresh:
    alert_id: int
    condition: ActiveCondition
    notify: bool


@dataclass
class AlertPlan:
    create: list[ActiveCondition] = field(default_factory=list)
    refresh: list[Refresh] = field(default_factory=list)
    resolve: list[OpenAlert] = field(default_factory=list)


def plan_alerts(
    open_alerts: Sequence[OpenAlert],
    active: Sequence[ActiveCondition],
    *,
    now: datetime,
    renotify_after: timedelta,
) -> AlertPlan:
    plan = AlertPlan()
    by_kind = {a.kind: a for a in open_alerts}
    active_kinds = set()
    for condition in active:
        if condition.kind in active_kinds:
            continue
        active_kinds.add(condition.kind)
        existing = by_kind.get(condition.kind)
        if existing is None:
            plan.create.append(condition)
            continue
        escalated = SEVERITY_RANK.get(condition.severity, 0) > SEVERITY_RANK.get(existing.severity, 0)
        due = existing.last_notified_at is None or now - existing.last_notified_at >= renotify_after
        notify = escalated or (existing.status == "open" and due)
        plan.refresh.append(Refresh(existing.id, condition, notify))
    plan.resolve = [a for a in open_alerts if a.kind not in active_kinds]
    return plan
