"""Issue 23, alerts people can act on: a flickering finding is one alert (it re-opens within the hold,
counted, without a new notification) and an open alert's `last_step` is the last step its condition held,
in the API, `lldmon alerts list`, the dashboard and the notifications."""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from contracts import alerts as A
from contracts.metrics import GRAD_NORM
from contracts.wire import API_PREFIX, encode_float
from lldmon_lab.scenarios import Scenario, healthy_scenario
from monitor.alerting.rules import ActiveCondition, OpenAlert, ResolvedAlert, plan_alerts
from monitor.config import Settings
from monitor.detector import findings as F
from monitor.domain import AlertInfo, Principal, RunInfo
from monitor.services.alerts import DEFAULT_HOLD_STEPS, AlertRun, Notifications
from monitor.store import alerts as alert_store

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
HOLD = 20
KIND = F.REWARD_ZERO


def cond(
    step: int, active_at: int | None = None, kind: str = KIND, severity: str = "critical"
) -> ActiveCondition:
    return ActiveCondition(kind, severity, step, "reward at about zero", {"active_at": active_at}, active_at)


def resolved(alert_id: int = 5, resolved_step: int = 120, **changes: Any) -> ResolvedAlert:
    alert = ResolvedAlert(alert_id, KIND, "critical", 100, resolved_step, acknowledged=False, reopen_count=1)
    return dataclasses.replace(alert, **changes)


# -- the pure rule ----------------------------------------------------------------------------------------


def test_a_kind_back_within_the_hold_continues_its_latest_alert() -> None:
    latest, older = resolved(5, resolved_step=120), resolved(2, resolved_step=139)
    plan = plan_alerts(
        [], [cond(140)], now=NOW, renotify_after=HOUR, resolved=[latest, older], hold_steps=HOLD
    )
    assert plan.create == [] and [(r.alert.id, r.status) for r in plan.reopen] == [(5, "open")]
    assert not plan.reopen[0].raises_severity
    # One step past the hold is a new alert; so is any return without a hold (liveness) or precedent.
    for late in (
        plan_alerts([], [cond(141)], now=NOW, renotify_after=HOUR, resolved=[latest], hold_steps=HOLD),
        plan_alerts([], [cond(121)], now=NOW, renotify_after=HOUR, resolved=[latest]),
        plan_alerts([], [cond(121)], now=NOW, renotify_after=HOUR, hold_steps=HOLD),
        plan_alerts(
            [],
            [cond(121, kind=F.NONFINITE_GRAD)],
            now=NOW,
            renotify_after=HOUR,
            resolved=[latest],
            hold_steps=HOLD,
        ),
    ):
        assert late.reopen == [] and len(late.create) == 1
    # Acknowledged before it resolved: it continues acknowledged (no re-notifications).
    acked = plan_alerts(
        [], [cond(125)], now=NOW, renotify_after=HOUR, resolved=[resolved(acknowledged=True)], hold_steps=HOLD
    )
    assert [r.status for r in acked.reopen] == ["acknowledged"]
    # A caller judges only its own kinds.
    other = plan_alerts(
        [],
        [cond(125)],
        now=NOW,
        renotify_after=HOUR,
        resolved=[latest],
        hold_steps=HOLD,
        kinds={"run_stalled"},
    )
    assert other.reopen == [] and other.create == [cond(125)]


def test_a_resolution_already_announced_is_not_announced_again() -> None:
    quiet = OpenAlert(5, KIND, "critical", "open", NOW, first_step=100, last_step=110, last_event=A.RESOLVED)
    plan = plan_alerts([quiet], [], now=NOW, renotify_after=HOUR)
    assert plan.resolve == [quiet] and not plan.announces_resolution(quiet)
    assert plan.announces_resolution(dataclasses.replace(quiet, last_event=A.FIRING))
    assert plan.announces_resolution(dataclasses.replace(quiet, last_event=None))  # before the column


def test_a_critical_kind_back_within_the_hold_escalates_the_open_warning() -> None:
    decay = OpenAlert(1, F.LLD_DECAY, "warning", "open", NOW)
    collapse = ResolvedAlert(4, F.LLD_COLLAPSE, "critical", 150, 170, acknowledged=False)
    back = ActiveCondition(F.LLD_COLLAPSE, "critical", 180, "collapse", {})
    plan = plan_alerts([decay], [back], now=NOW, renotify_after=HOUR, resolved=[collapse], hold_steps=HOLD)
    assert [r.alert.id for r in plan.reopen] == [4] and plan.create == []
    assert plan.superseded == [(decay, F.LLD_COLLAPSE)] and plan.escalates(F.LLD_COLLAPSE) == decay
    rising = ResolvedAlert(4, "run_stalled", "warning", 10, 12, acknowledged=False)
    worse = plan_alerts(
        [],
        [ActiveCondition("run_stalled", "critical", 20, "crashed", {})],
        now=NOW,
        renotify_after=HOUR,
        resolved=[rising],
        hold_steps=HOLD,
    )
    assert worse.reopen[0].raises_severity


# -- the service and the store, on SQLite and PostgreSQL ----------------------------------------------------


@pytest.fixture
def state(settings: Settings) -> Iterator[Any]:
    from monitor.api.app import build_state

    services = build_state(settings.model_copy(update={"alert_hold_steps": HOLD}))
    yield services
    services.dispatcher.close()
    services.db.dispose()


@pytest.fixture
def run(state: Any) -> RunInfo:
    info, _ = state.runs.register(Principal(), "lab-never-learned", "lab", {}, [])
    return info  # type: ignore[no-any-return]


def judge(
    state: Any, run: RunInfo, active: list[ActiveCondition], last_step: int, now: datetime = NOW
) -> Notifications:
    """What the detector does after each batch: judge its kinds under the run's lock, in one transaction."""
    with state.db.write() as conn:
        alert_store.lock_run(conn, run.id)
        notes: Notifications = state.alerts.judge(
            conn,
            AlertRun(run.id, run.name, run.project),
            active,
            kinds=F.ALL_KINDS,
            last_step=last_step,
            now=now,
        )
    return notes


def alerts_of(state: Any, run: RunInfo) -> list[AlertInfo]:
    return state.alerts.list(Principal(), run.id)  # type: ignore[no-any-return]


def events(notes: Notifications) -> list[tuple[str, int]]:
    return [(n.event, n.alert_id) for n in notes]


def test_a_flickering_finding_is_one_alert_counted_and_notified_once(state: Any, run: RunInfo) -> None:
    """Regression: on a lab run that never learned, reward_zero opened (and notified) 14 times."""
    first = judge(state, run, [cond(100, 103)], 103)
    [(_, alert_id)] = events(first)
    assert events(first) == [(A.FIRING, alert_id)]
    assert events(judge(state, run, [], 104)) == [(A.RESOLVED, alert_id)]
    (alert,) = alerts_of(state, run)
    assert (alert.status, alert.first_step, alert.last_step, alert.resolved_step) == (
        "resolved",
        100,
        103,
        104,
    )

    # Back 6 steps later: the same alert goes on, counted, and nobody is paged again.
    assert judge(state, run, [cond(110, 112)], 112) == []
    (alert,) = alerts_of(state, run)
    assert (alert.id, alert.status, alert.reopen_count) == (alert_id, "open", 1)
    assert (alert.first_step, alert.last_step, alert.resolved_step, alert.resolved_at) == (
        100,
        112,
        None,
        None,
    )
    # Judging the same step again changes nothing (a refresh, not a second re-opening).
    assert judge(state, run, [cond(110, 112)], 112) == []
    assert alerts_of(state, run)[0].reopen_count == 1
    # It clears again: receivers were already told it resolved, so that is not sent twice.
    assert judge(state, run, [], 113) == []
    assert judge(state, run, [cond(133, 133)], 133) == []  # 20 steps after step 113: still the same one
    assert judge(state, run, [], 134) == []
    (alert,) = alerts_of(state, run)
    assert (alert.status, alert.reopen_count, alert.last_step, alert.resolved_step) == (
        "resolved",
        2,
        133,
        134,
    )

    # 21 steps after it resolved: a new alert, notified.
    later = judge(state, run, [cond(155, 155)], 155)
    assert [n.event for n in later] == [A.FIRING] and later[0].alert_id != alert_id
    assert [(a.id, a.status, a.reopen_count) for a in alerts_of(state, run)] == [
        (alert_id, "resolved", 2),
        (later[0].alert_id, "open", 0),
    ]

    # Race-safe writes: a re-opening or resolution that lost its race changes nothing.
    with state.db.write() as conn:
        assert alert_store.reopen(conn, later[0].alert_id, cond(156, 156), "open", NOW) is False
        assert alert_store.resolve(conn, alert_id, 200, NOW, announced=True) is False
    assert [(a.status, a.reopen_count, a.resolved_step) for a in alerts_of(state, run)] == [
        ("resolved", 2, 134),
        ("open", 0, None),
    ]


def test_a_continued_alert_keeps_its_acknowledgement_and_the_regular_reminders(
    state: Any, run: RunInfo
) -> None:
    acked = judge(state, run, [cond(100, 100)], 100)[0].alert_id
    state.alerts.acknowledge(Principal(), run.id, acked)
    judge(state, run, [], 101)
    assert judge(state, run, [cond(105, 105)], 105, NOW + 2 * HOUR) == []
    assert judge(state, run, [cond(105, 106)], 106, NOW + 3 * HOUR) == []  # acknowledged: no reminder
    assert alerts_of(state, run)[0].status == "acknowledged"

    other = judge(state, run, [cond(100, 100, kind=F.DEAD_RUN)], 107)[0].alert_id
    judge(state, run, [cond(105, 108)], 108)  # dead_run cleared
    assert judge(state, run, [cond(110, 110, kind=F.DEAD_RUN)], 110, NOW + HOUR / 2) == []
    # An open continued alert is reminded of at the usual cadence; its steps and flicker count go along.
    [reminder] = judge(state, run, [cond(110, 130, kind=F.DEAD_RUN)], 130, NOW + 2 * HOUR)
    assert (reminder.event, reminder.alert_id, reminder.reopen_count) == (A.FIRING, other, 1)
    assert (reminder.step, reminder.first_step, reminder.last_step) == (110, 100, 130)
    assert "steps 100-130 (re-opened once)" in reminder.summary()
    # ... after which its resolution is news again.
    assert [n.event for n in judge(state, run, [], 131, NOW + 2 * HOUR) if n.alert_id == other] == [
        A.RESOLVED
    ]


def test_an_open_alerts_last_step_follows_its_condition(state: Any, run: RunInfo) -> None:
    """Regression: "steps 157-157" while the alert was still active at step 256."""
    [fired] = judge(state, run, [cond(157, 157)], 157)
    assert (fired.first_step, fired.last_step) == (157, 157)
    judge(state, run, [cond(157, 200)], 200)
    assert (alerts_of(state, run)[0].first_step, alerts_of(state, run)[0].last_step) == (157, 200)
    judge(state, run, [cond(157, 190)], 200)  # never moves back
    assert alerts_of(state, run)[0].last_step == 200
    [reminder] = judge(state, run, [cond(157, 256)], 256, NOW + 2 * HOUR)
    assert (reminder.first_step, reminder.last_step) == (157, 256)
    assert "(run " in reminder.summary() and " steps 157-256: " in reminder.summary()
    assert reminder.payload()["last_step"] == 256
    [cleared] = judge(state, run, [], 260)
    assert cleared.event == A.RESOLVED and "step 260 (held at steps 157-256)" in cleared.summary()
    (alert,) = alerts_of(state, run)
    assert (alert.last_step, alert.resolved_step) == (256, 260)


def test_liveness_alerts_have_no_hold(state: Any, run: RunInfo) -> None:
    stalled = ActiveCondition("run_stalled", "warning", 10, "silent", {})
    assert [n.event for n in state.alerts.raise_alert(run, stalled)] == [A.FIRING]
    assert [n.event for n in state.alerts.clear_alert(run, "run_stalled", 11)] == [A.RESOLVED]
    assert [n.event for n in state.alerts.raise_alert(run, stalled)] == [A.FIRING]  # a second stall is news
    assert [a.reopen_count for a in alerts_of(state, run)] == [0, 0]


def test_the_hold_is_a_setting_with_a_default() -> None:
    assert Settings().alert_hold_steps == DEFAULT_HOLD_STEPS == 20
    assert Settings(alert_hold_steps=0).alert_hold_steps == 0
    with pytest.raises(ValueError, match="alert_hold_steps"):
        Settings(alert_hold_steps=-1)


# -- through the API, the CLI and the dashboard --------------------------------------------------------------


class Hook:
    """The webhook receiver at the transport edge: every body the service sends."""

    URL = "http://hooks.test/lldmon"

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.bodies.append(json.loads(request.content))
        return httpx.Response(200)

    def sent(self, kind: str) -> list[tuple[str, int]]:
        with self.lock:
            return [(b["event"], b["alert_id"]) for b in self.bodies if b["kind"] == kind]


def nan_blips(scenario: Scenario, at: tuple[int, ...]) -> Scenario:
    grad = scenario.values[GRAD_NORM].copy()
    grad[list(at)] = np.nan
    return dataclasses.replace(scenario, values={**scenario.values, GRAD_NORM: grad})


def post_step(client: TestClient, run_id: int, scenario: Scenario, i: int) -> None:
    metrics = {
        name: [encode_float(float(values[i])) if scenario.present[name][i] else None]
        for name, values in scenario.values.items()
    }
    body = {"batch_id": uuid.uuid4().hex, "steps": [int(scenario.steps[i])], "metrics": metrics}
    response = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body)
    assert response.status_code == 200, response.text


def test_a_flickering_nan_grad_norm_through_the_api_cli_and_dashboard(settings: Settings) -> None:
    from dashboard.data import run_context
    from dashboard.figures import alert_markers
    from dashboard.pages.run import timeline_rows
    from monitor.api.app import create_app
    from monitor.cli import app as cli

    # A NaN grad norm latches `nonfinite_grad` for 5 finite values: active 40-44, 52-56, 64-68, 110-114.
    scenario = nan_blips(healthy_scenario(2, n_steps=125), (40, 52, 64, 110))
    hook = Hook()
    app = create_app(
        settings.model_copy(update={"webhook_urls": [Hook.URL], "alert_hold_steps": HOLD}),
        sink_transport=hook.transport,
    )
    runner = CliRunner()
    try:
        with TestClient(app) as client:
            run_id = client.post(f"{API_PREFIX}/runs", json={"name": "blips"}).json()["id"]
            for i in range(43):
                post_step(client, run_id, scenario, i)
            # Still active at step 42: the open alert's last step is 42 everywhere.
            [live] = [
                a
                for a in client.get(f"{API_PREFIX}/runs/{run_id}/alerts").json()
                if a["kind"] == F.NONFINITE_GRAD
            ]
            assert (live["status"], live["first_step"], live["last_step"]) == ("open", 40, 42)
            table = runner.invoke(
                cli,
                ["alerts", "list", str(run_id), "--database-url", settings.resolved_database_url()],
                env={"COLUMNS": "250"},
            )
            assert table.exit_code == 0, table.output
            assert "40-42" in table.output
            state = app.state.lldmon
            rows = [r for r in timeline_rows(run_context(state, Principal(), run_id)) if r.kind == "alert"]
            assert any(r.detail.startswith("steps 40-42: ") for r in rows)

            for i in range(43, len(scenario.steps)):
                post_step(client, run_id, scenario, i)
            assert state.dispatcher.join(10)
            alerts = [
                a
                for a in client.get(f"{API_PREFIX}/runs/{run_id}/alerts").json()
                if a["kind"] == F.NONFINITE_GRAD
            ]
            infos = [a for a in state.alerts.list(Principal(), run_id) if a.kind == F.NONFINITE_GRAD]
            hover = " ".join(m.hover for m in alert_markers(infos))
            timeline = [
                r.detail for r in timeline_rows(run_context(state, Principal(), run_id)) if r.kind == "alert"
            ]
    finally:
        app.state.lldmon.db.dispose()

    # Three blips 7 steps apart are one alert that re-opened twice; the blip 41 steps later is another.
    assert [
        (a["status"], a["first_step"], a["last_step"], a["resolved_step"], a["reopen_count"]) for a in alerts
    ] == [("resolved", 40, 68, 69, 2), ("resolved", 110, 114, 115, 0)]
    first, second = (a["id"] for a in alerts)
    assert hook.sent(F.NONFINITE_GRAD) == [
        (A.FIRING, first),
        (A.RESOLVED, first),
        (A.FIRING, second),
        (A.RESOLVED, second),
    ]
    firing = next(b for b in hook.bodies if b["kind"] == F.NONFINITE_GRAD)
    assert (firing["first_step"], firing["last_step"], firing["reopen_count"]) == (40, 40, 0)
    assert "steps 40-68 (re-opened 2 times)" in hover
    assert any(d.startswith("steps 40-68 (re-opened 2 times): ") for d in timeline)
    shown = runner.invoke(
        cli, ["runs", "show", str(run_id), "--json", "--database-url", settings.resolved_database_url()]
    )
    assert shown.exit_code == 0, shown.output
    assert [
        (a["first_step"], a["last_step"], a["resolved_step"], a["reopen_count"])
        for a in json.loads(shown.output)["alerts"]
        if a["kind"] == F.NONFINITE_GRAD
    ] == [(40, 68, 69, 2), (110, 114, 115, 0)]


def test_alerts_refreshed_together_each_take_their_own_condition(state: Any, run: RunInfo) -> None:
    """Quiet refreshes go in one statement (`refresh_quietly`): each alert gets its own message,
    evidence and last step, which never moves back, and a notifying refresh still notifies."""
    a = ActiveCondition(F.ENTROPY_RISE, "warning", 10, "entropy up", {"z": 3.0}, 10)
    b = ActiveCondition(F.KL_BLOWUP, "critical", 10, "kl up", {"ratio": 9.0}, 10)
    assert len(events(judge(state, run, [a, b], 10))) == 2
    moved = [
        dataclasses.replace(a, active_at=14, message="entropy still up", evidence={"z": 4.5}),
        dataclasses.replace(b, active_at=9, message="kl still up", evidence={"ratio": 12.0}),
    ]
    assert judge(state, run, moved, 14) == []
    by_kind = {x.kind: x for x in alerts_of(state, run)}
    assert (by_kind[F.ENTROPY_RISE].last_step, by_kind[F.ENTROPY_RISE].message) == (14, "entropy still up")
    assert by_kind[F.ENTROPY_RISE].evidence == {"z": 4.5}
    assert (by_kind[F.KL_BLOWUP].last_step, by_kind[F.KL_BLOWUP].message) == (10, "kl still up")
    assert by_kind[F.KL_BLOWUP].evidence == {"ratio": 12.0}
    assert [(x.status, x.severity) for x in alerts_of(state, run)] == [
        ("open", "warning"),
        ("open", "critical"),
    ]
