"""The service's middle: `monitor.bootstrap.build_services` wires one instance of each service (typed,
frozen, closed by `Services.close`); the alerting service owns plan -> store -> notify; the directives
service owns every directive change, manual and automatic. On SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest

from contracts.directive import SOURCE_DETECTOR, SOURCE_MANUAL, LLDSDirective
from monitor.alerting.sinks import Notification
from monitor.bootstrap import Services, build_services
from monitor.config import Settings
from monitor.domain import ActiveCondition, Principal
from monitor.errors import InvalidInput
from monitor.services.alerts import AlertRun

P = Principal()


class SpyDispatcher:
    """Stands in for the sinks: what was handed over, and when."""

    def __init__(self) -> None:
        self.submitted: list[Notification] = []

    def submit(self, notifications: Sequence[Notification]) -> None:
        self.submitted.extend(notifications)


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    built = build_services(settings)
    yield built
    built.close()


def test_services_are_typed_frozen_and_share_one_instance_of_each(services: Services) -> None:
    for name, kind in typing.get_type_hints(Services).items():
        assert isinstance(getattr(services, name), kind), name
    with pytest.raises(dataclasses.FrozenInstanceError):
        services.alerts = services.alerts  # type: ignore[misc]
    assert services.detection.alerts is services.alerts is services.liveness.alerts
    assert services.detection.directives is services.directives
    assert services.alerts.dispatcher is services.dispatcher


def test_the_api_names_stay_aliases_of_the_bootstrap() -> None:
    from monitor.api.app import AppState, assemble_state, build_state
    from monitor.api.state import AppState as StateAppState
    from monitor.bootstrap import assemble_services

    assert AppState is StateAppState is Services
    assert build_state is build_services and assemble_state is assemble_services


def test_close_stops_the_sinks_then_releases_the_database(settings: Settings, monkeypatch: Any) -> None:
    built = build_services(settings)
    calls: list[str] = []

    def recorded(name: str, call: Any) -> Any:
        return lambda *args, **kwargs: (calls.append(name), call(*args, **kwargs))

    monkeypatch.setattr(built.dispatcher, "close", recorded("sinks", built.dispatcher.close))
    monkeypatch.setattr(built.db, "dispose", recorded("db", built.db.dispose))
    built.close()
    assert calls == ["sinks", "db"]  # queued notifications are delivered (and recorded) first
    assert built.db.engine.pool.checkedout() == 0


def _run(services: Services, name: str = "r") -> Any:
    run, _ = services.runs.register(P, name, "p", {}, [])
    return run


def test_judge_stores_in_the_callers_transaction_and_notify_sends_after(services: Services) -> None:
    spy = SpyDispatcher()
    services.alerts.dispatcher = spy  # type: ignore[assignment]
    run = _run(services)
    nan = ActiveCondition("nonfinite_grad_norm", "critical", 5, "grad norm NaN", {"value": "NaN"})
    with services.db.write() as conn:
        notes = services.alerts.judge(conn, AlertRun(run.id, run.name, run.project), [nan], last_step=5)
        assert spy.submitted == []  # nothing leaves before the commit
    assert [(n.event, n.kind) for n in notes] == [("firing", "nonfinite_grad_norm")]
    (alert,) = services.alerts.list(P, run.id)
    assert (alert.status, alert.severity, alert.evidence) == ("open", "critical", {"value": "NaN"})
    services.alerts.notify(notes)
    assert spy.submitted == notes
    # The same condition again, not yet due for a re-notification: refreshed, nothing to send.
    with services.db.write() as conn:
        again = services.alerts.judge(conn, AlertRun(run.id, run.name, run.project), [nan], last_step=6)
    assert again == []
    with services.db.write() as conn:
        cleared = services.alerts.judge(conn, AlertRun(run.id, run.name, run.project), [], last_step=7)
    assert [n.event for n in cleared] == ["resolved"]
    assert [a.status for a in services.alerts.list(P, run.id)] == ["resolved"]


def test_liveness_raises_its_alert_through_the_alerting_service(services: Services) -> None:
    spy = SpyDispatcher()
    services.alerts.dispatcher = spy  # type: ignore[assignment]
    run = _run(services)
    later = run.last_seen_at + timedelta(seconds=services.settings.stall_after_seconds + 1)
    assert services.liveness.sweep(later) == [(run.id, "stalled")]
    assert [(n.event, n.kind) for n in spy.submitted] == [("firing", "run_stalled")]
    assert services.alerts.runs_with_open([run.id], "run_stalled") == {run.id}
    services.liveness.heartbeat(P, run.id)
    assert [n.event for n in spy.submitted] == ["firing", "resolved"]
    assert services.alerts.runs_with_open([run.id], "run_stalled") == set()


def test_manual_directive_changes_are_versions_with_their_source(services: Services) -> None:
    run = _run(services)
    first = services.directives.set_manual(P, run.id, llds_enabled=True, lam=0.25)
    assert (first.version, first.llds, first.source, first.llds_manual) == (
        1,
        LLDSDirective(True, 0.25),
        SOURCE_MANUAL,
        True,
    )
    second = services.directives.set_manual(P, run.id, checkpoint=True, stop=True)
    assert (
        second.checkpoint == 2
        and second.stop == 2
        and second.reason == "manual checkpoint request, stop request"
    )
    withdrawn = services.directives.set_manual(P, run.id, stop=False)
    assert withdrawn.stop == 0
    assert [d.version for d in services.directives.history(P, run.id)] == [1, 2, 3]
    assert services.directives.current(P, run.id) == withdrawn
    with pytest.raises(InvalidInput, match="nothing to change"):
        services.directives.set_manual(P, run.id)
    with pytest.raises(InvalidInput, match="lambda") as bad:
        services.directives.set_manual(P, run.id, lam=float("nan"))
    assert bad.value.field == "lam"
    assert len(services.directives.history(P, run.id)) == 3  # nothing written by a rejected change


def test_auto_directive_follows_the_rules_in_the_callers_transaction(services: Services) -> None:
    auto, manual = _run(services, "auto"), _run(services, "manual")
    services.runs.set_policy(P, auto.id, "auto")
    with services.db.write() as conn:
        d = services.directives.apply_auto(conn, auto.id, "auto", "decay", 40, [("decay", 40)]).directive
    assert (d.version, d.llds.enabled, d.checkpoint, d.stop, d.source) == (1, True, 1, 0, SOURCE_DETECTOR)
    assert d.step == 40 and "checkpoint requested" in d.reason
    with services.db.write() as conn:  # still in decay, nothing entered, not yet time to escalate
        assert services.directives.apply_auto(conn, auto.id, "auto", "decay", 41, []).directive.version == 1
    services.directives.set_manual(P, manual.id, stop_on_collapse=True)
    with services.db.write() as conn:  # not `auto`: no LLDS and no checkpoint, but the opted-in stop
        d = services.directives.apply_auto(
            conn, manual.id, "manual", "collapse", 90, [("collapse", 90)]
        ).directive
    assert (d.llds.enabled, d.checkpoint, d.stop > 0) == (False, 0, True)
    assert "stop-on-collapse" in d.stop_reason
