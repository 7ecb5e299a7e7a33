"""Alert de-duplication, re-notification, escalation and resolution (pure rules)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from monitor.alerting.rules import ActiveCondition, OpenAlert, plan_alerts

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def cond(kind: str = "lld_decay", severity: str = "warning", step: int = 10) -> ActiveCondition:
    return ActiveCondition(kind, severity, step, "msg", {})


def test_new_condition_opens_one_alert_per_kind() -> None:
    plan = plan_alerts(
        [], [cond(), cond(step=11), cond("nonfinite_grad", "critical")], now=NOW, renotify_after=HOUR
    )
    assert [c.kind for c in plan.create] == ["lld_decay", "nonfinite_grad"]
    assert plan.refresh == [] and plan.resolve == []


def test_still_active_condition_refreshes_without_renotifying_too_soon() -> None:
    alert = OpenAlert(1, "lld_decay", "warning", "open", NOW - timedelta(minutes=5))
    plan = plan_alerts([alert], [cond(step=12)], now=NOW, renotify_after=HOUR)
    assert plan.create == [] and len(plan.refresh) == 1
    assert plan.refresh[0].notify is False and plan.refresh[0].condition.step == 12


def test_renotify_after_interval_but_not_when_acknowledged() -> None:
    old = NOW - 2 * HOUR
    open_alert = OpenAlert(1, "lld_decay", "warning", "open", old)
    acked = OpenAlert(2, "entropy_collapse", "warning", "acknowledged", old)
    plan = plan_alerts([open_alert, acked], [cond(), cond("entropy_collapse")], now=NOW, renotify_after=HOUR)
    assert {r.alert_id: r.notify for r in plan.refresh} == {1: True, 2: False}


def test_severity_escalation_notifies_even_when_acknowledged() -> None:
    acked = OpenAlert(1, "lld_decay", "warning", "acknowledged", NOW)
    plan = plan_alerts([acked], [cond(severity="critical")], now=NOW, renotify_after=HOUR)
    assert plan.refresh[0].notify is True


def test_cleared_condition_resolves() -> None:
    alert = OpenAlert(1, "lld_decay", "warning", "open", NOW)
    plan = plan_alerts([alert], [], now=NOW, renotify_after=HOUR)
    assert plan.resolve == [alert]
