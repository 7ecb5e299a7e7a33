"""Issue 15, delivery that cannot jam and says what happened: one worker per sink (a blackholed webhook
never delays a live one), minimum severity per sink, HMAC-signed webhooks, the run's dashboard link,
`escalated` (never `resolved`) when a warning becomes critical, and delivery state per alert and sink in
the database, the API and `lldmon alerts list`."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import inspect, text
from typer.testing import CliRunner

from contracts import alerts as A
from contracts.metrics import GRAD_NORM
from contracts.wire import API_PREFIX, encode_float
from lldmon_lab.scenarios import Scenario, collapse_scenario, healthy_scenario
from monitor.alerting.rules import ActiveCondition, OpenAlert, plan_alerts
from monitor.alerting.sinks import Dispatcher, Notification, SlackSink, WebhookSink, build_sinks
from monitor.cli import app as cli
from monitor.config import Settings
from monitor.db.engine import make_engine
from monitor.db.migrate import downgrade, upgrade
from monitor.detector import findings as F
from monitor.telemetry import ServiceMetrics, Snapshot
from tests.conftest import live_server_on
from tests.live_server import blackhole

SECRET = "s3cret"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class Receiver:
    """A loopback webhook receiver that keeps each request's headers and raw body."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                receiver.arrived.set()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]

    def wait_for(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < n:
            assert time.monotonic() < deadline, f"{len(self.requests)} of {n} requests after {timeout}s"
            time.sleep(0.02)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def telemetry() -> ServiceMetrics:
    return ServiceMetrics(CollectorRegistry(), Snapshot)


def note(severity: str = "critical", event: str = A.FIRING, alert_id: int = 1) -> Notification:
    return Notification(
        event, alert_id, 3, "grpo-3b", "nq", "nonfinite_grad", severity, 140, "grad norm NaN", {}, ["x"]
    )


def signature_ok(headers: dict[str, str], body: bytes) -> bool:
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get(A.SIGNATURE_HEADER.lower(), ""), expected)


# -- pure rules ---------------------------------------------------------------------------------------


def test_warning_that_turns_critical_is_escalated_not_resolved() -> None:
    """Regression: `lld_decay` giving way to `lld_collapse` was notified as "lld_decay RESOLVED"."""
    decay = OpenAlert(1, F.LLD_DECAY, "warning", "open", NOW)
    collapse = ActiveCondition(F.LLD_COLLAPSE, "critical", 200, "collapse", {})
    plan = plan_alerts([decay], [collapse], now=NOW, renotify_after=timedelta(hours=1))
    assert plan.resolve == []
    assert plan.superseded == [(decay, F.LLD_COLLAPSE)]
    assert plan.create == [collapse] and plan.escalates(F.LLD_COLLAPSE) == decay

    # The same kind rising in severity is escalated too, even while acknowledged.
    stalled = OpenAlert(2, "run_stalled", "warning", "acknowledged", NOW)
    worse = ActiveCondition("run_stalled", "critical", 210, "crashed?", {})
    plan = plan_alerts([stalled], [worse], now=NOW, renotify_after=timedelta(hours=1))
    assert [(r.notify, r.event, r.previous_severity) for r in plan.refresh] == [
        (True, A.ESCALATED, "warning")
    ]

    # A warning that clears while an unrelated critical fires did recover: resolved as before.
    entropy = OpenAlert(3, F.ENTROPY_COLLAPSE, "warning", "open", NOW)
    nan = ActiveCondition(F.NONFINITE_GRAD, "critical", 220, "nan", {})
    plan = plan_alerts([entropy], [nan], now=NOW, renotify_after=timedelta(hours=1))
    assert plan.resolve == [entropy] and plan.superseded == []


def test_a_caller_judges_only_its_own_kinds() -> None:
    """The detector must not resolve a liveness `run_stalled` alert it knows nothing about."""
    stalled = OpenAlert(1, "run_stalled", "warning", "open", NOW)
    plan = plan_alerts([stalled], [], now=NOW, renotify_after=timedelta(hours=1), kinds=F.ALL_KINDS)
    assert plan.resolve == [] and plan.refresh == [] and plan.create == []


def test_canonical_names_agree() -> None:
    from typing import get_args

    from monitor.cli import AlertStatus
    from monitor.config import Severity

    assert get_args(Severity) == A.SEVERITIES
    assert get_args(AlertStatus) == A.ALERT_STATUSES


# -- sinks and dispatcher -----------------------------------------------------------------------------


def test_blackholed_sink_never_delays_a_live_one(receiver: Receiver, telemetry: ServiceMetrics) -> None:
    updates: list[Any] = []
    with blackhole() as dead_url:
        dead = WebhookSink(dead_url, timeout=1.5)
        live = WebhookSink(receiver.url, timeout=3.0)
        dispatcher = Dispatcher(
            [dead, live], telemetry, max_attempts=2, base_delay=0.01, recorder=updates.extend
        )
        start = time.monotonic()
        dispatcher.submit([note(alert_id=i) for i in range(1, 4)])
        receiver.wait_for(3, timeout=1.2)  # each request to the dead sink alone takes 1.5 s
        assert time.monotonic() - start < 1.2
        assert dispatcher.join(15)
        dispatcher.close()
    final = {(u.sink, u.alert_id): u for u in updates}
    assert {final[live.name, i].status for i in (1, 2, 3)} == {A.DELIVERED}
    assert {final[dead.name, i].status for i in (1, 2, 3)} == {A.FAILED}
    assert (
        final[dead.name, 1].attempts == 2 and final[dead.name, 1].error == "no complete answer within 1.5 s"
    )
    seen = [(u.sink, u.alert_id, u.status) for u in updates]
    assert seen.index((dead.name, 1, A.PENDING)) < seen.index((dead.name, 1, A.RETRYING))


def test_minimum_severity_per_sink_and_signed_webhook(receiver: Receiver, telemetry: ServiceMetrics) -> None:
    slack = Receiver()
    try:
        webhook = WebhookSink(receiver.url, timeout=5.0, min_severity="critical", secret=SECRET)
        dispatcher = Dispatcher(
            [webhook, SlackSink(slack.url, timeout=5.0)], telemetry, public_url="https://m.io/"
        )
        dispatcher.submit([note("warning", alert_id=1), note("critical", A.ESCALATED, alert_id=2)])
        assert dispatcher.join(10)
        dispatcher.close()
        assert [b["alert_id"] for b in receiver.bodies] == [2]  # the warning stayed below its minimum
        assert [len(slack.requests)] == [2]
        headers, raw = receiver.requests[0]
        assert signature_ok(headers, raw)
        assert not signature_ok(headers, raw.replace(b"grpo-3b", b"grpo-4b"))
        body = receiver.bodies[0]
        assert body["event"] == "escalated" and body["dashboard_url"] == "https://m.io/dashboard/run/3"
        assert datetime.fromisoformat(body["timestamp"]).tzinfo is not None
        assert "[ESCALATED CRITICAL]" in slack.bodies[1]["text"]
        assert "https://m.io/dashboard/run/3" in slack.bodies[1]["text"]
    finally:
        slack.close()


def test_diagnoses_are_recorded_but_sent_nowhere_by_default(
    receiver: Receiver, telemetry: ServiceMetrics
) -> None:
    """`info` alerts (the advantage-collapse diagnosis, which most runs with small groups get) stay with
    the run: the default sinks send warnings and up; a sink set to `info` gets them too."""
    assert F.SEVERITY[F.ADVANTAGE_COLLAPSE] == "info"
    verbose = Receiver()
    try:
        default = build_sinks(Settings(webhook_urls=[receiver.url]))
        chatty = build_sinks(Settings(webhook_urls=[verbose.url], webhook_min_severity="info"))
        dispatcher = Dispatcher([*default, *chatty[1:]], telemetry)
        dispatcher.submit([note("info", alert_id=1), note("warning", alert_id=2)])
        assert dispatcher.join(10)
        dispatcher.close()
        assert [b["alert_id"] for b in receiver.bodies] == [2]
        assert sorted(b["alert_id"] for b in verbose.bodies) == [1, 2]
    finally:
        verbose.close()


# -- through the service (both databases) -------------------------------------------------------------


def stream(client: TestClient, run_id: int, scenario: Scenario, batch_steps: int = 20) -> None:
    for lo in range(0, len(scenario.steps), batch_steps):
        sl = slice(lo, lo + batch_steps)
        metrics = {
            name: [
                encode_float(float(v)) if p else None
                for v, p in zip(values[sl], scenario.present[name][sl], strict=True)
            ]
            for name, values in scenario.values.items()
        }
        body = {
            "batch_id": uuid.uuid4().hex,
            "steps": [int(s) for s in scenario.steps[sl]],
            "metrics": metrics,
        }
        response = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body)
        assert response.status_code == 200, response.text


def test_decay_into_collapse_is_sent_as_escalated(settings: Settings, receiver: Receiver) -> None:
    """Regression: the run that slid from decay into collapse paged "[RESOLVED] lld_decay"."""
    from monitor.api.app import create_app

    app = create_app(settings.model_copy(update={"webhook_urls": [receiver.url]}))
    with TestClient(app) as client:
        run_id = client.post(f"{API_PREFIX}/runs", json={"name": "slide"}).json()["id"]
        stream(client, run_id, collapse_scenario(3))
        assert app.state.lldmon.dispatcher.join(10)
        alerts = client.get(f"{API_PREFIX}/runs/{run_id}/alerts").json()
    app.state.lldmon.db.dispose()
    sent = [(b["event"], b["kind"]) for b in receiver.bodies]
    assert (A.FIRING, F.LLD_DECAY) in sent
    assert (A.RESOLVED, F.LLD_DECAY) not in sent
    collapse = next(a for a in alerts if a["kind"] == F.LLD_COLLAPSE)
    assert (A.ESCALATED, F.LLD_COLLAPSE) in sent
    assert [(d["event"], d["status"]) for d in collapse["deliveries"]] in (
        [(A.ESCALATED, A.DELIVERED)],
        [(A.RESOLVED, A.DELIVERED)],  # the scenario may recover at its very end
    )


def test_raise_and_clear_an_alert_outside_the_detector(settings: Settings, receiver: Receiver) -> None:
    """`AlertService.raise_alert` / `clear_alert` (liveness): escalated when it turns critical, left
    alone by the detector's next batch, resolved by `clear_alert`; deliveries stored per sink."""
    from monitor.api.app import build_state
    from monitor.domain import Principal

    state = build_state(settings.model_copy(update={"webhook_urls": [receiver.url]}))
    try:
        run, _ = state.runs.register(Principal(), "quiet-job", None, {}, [])
        stalled = ActiveCondition("run_stalled", "warning", 0, "no data for 10 min", {"silent_s": 600})
        assert [n.event for n in state.alerts.raise_alert(run, stalled)] == [A.FIRING]
        crashed = ActiveCondition("run_stalled", "critical", 0, "no data for 1 h", {"silent_s": 3600})
        assert [n.event for n in state.alerts.raise_alert(run, crashed)] == [A.ESCALATED]
        scenario = healthy_scenario(1, n_steps=60)
        with TestClient(_app_of(state)) as client:
            stream(client, run.id, scenario)
        (alert,) = state.alerts.list(Principal(), run.id)
        assert (alert.kind, alert.severity, alert.status) == ("run_stalled", "critical", "open")
        assert [n.event for n in state.alerts.clear_alert(run, "run_stalled", 59)] == [A.RESOLVED]
        assert state.alerts.clear_alert(run, "run_stalled", 60) == []
        assert state.dispatcher.join(10)
        (alert,) = state.alerts.list(Principal(), run.id)
        assert alert.status == "resolved"
        assert [(d.event, d.status, d.attempts) for d in alert.deliveries] == [(A.RESOLVED, A.DELIVERED, 1)]
        assert [b["event"] for b in receiver.bodies] == [A.FIRING, A.ESCALATED, A.RESOLVED]
    finally:
        state.dispatcher.close()
        state.db.dispose()


def _app_of(state: Any) -> Any:
    """A FastAPI app around an already built state (so the test and the app share one dispatcher)."""
    from fastapi import FastAPI

    from monitor.api.errors import install_error_handlers
    from monitor.api.routes import ingest

    app = FastAPI()
    app.state.lldmon = state
    install_error_handlers(app)
    app.include_router(ingest.router, prefix=API_PREFIX)
    return app


# -- a real `lldmon serve` with a dead and a live webhook ---------------------------------------------


def test_live_server_delivers_past_a_dead_sink_and_says_what_happened(
    backend: str, tmp_path: Path, receiver: Receiver
) -> None:
    with blackhole() as dead_url:
        env = {
            "LLDMON_WEBHOOK_URLS": json.dumps([dead_url, receiver.url]),
            "LLDMON_WEBHOOK_SECRET": SECRET,
            "LLDMON_WEBHOOK_MIN_SEVERITY": "critical",
            "LLDMON_PUBLIC_URL": "https://lldmon.example.org",
            "LLDMON_SINK_TIMEOUT_SECONDS": "1",
            "LLDMON_SINK_MAX_ATTEMPTS": "2",
        }
        with live_server_on(backend, tmp_path, env) as live:
            run_id = httpx.post(f"{live.api}/runs", json={"name": "nan-run", "project": "nq"}).json()["id"]
            scenario = healthy_scenario(2, n_steps=80)
            grad = scenario.values[GRAD_NORM].copy()
            grad[45] = np.nan
            values = {**scenario.values, GRAD_NORM: grad}
            metrics = {
                name: [
                    encode_float(float(v)) if p else None
                    for v, p in zip(vals, scenario.present[name], strict=True)
                ]
                for name, vals in values.items()
            }
            body = {"batch_id": "b1", "steps": [int(s) for s in scenario.steps], "metrics": metrics}
            start = time.monotonic()
            assert httpx.post(f"{live.api}/runs/{run_id}/metrics", json=body, timeout=30).status_code == 200
            receiver.wait_for(1, timeout=5.0)
            assert time.monotonic() - start < 5.0  # the dead sink's 2 x 1 s timeouts did not come first

            for headers, raw in receiver.requests:
                assert signature_ok(headers, raw)
            payload = next(b for b in receiver.bodies if b["kind"] == F.NONFINITE_GRAD)
            assert payload["kind"] == F.NONFINITE_GRAD and payload["severity"] == "critical"
            assert payload["run_name"] == "nan-run" and payload["project"] == "nq" and payload["phase"]
            assert payload["explanation"] and payload["timestamp"]
            assert payload["dashboard_url"] == f"https://lldmon.example.org/dashboard/run/{run_id}"

            deadline = time.monotonic() + 30
            while True:  # the dead sink gives up after 2 attempts of 1 s each (per queued notification)
                alerts = live.get(f"/runs/{run_id}/alerts")
                nan_alert = next(a for a in alerts if a["id"] == payload["alert_id"])
                if A.FAILED in {d["status"] for d in nan_alert["deliveries"]} or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            by_status = {d["status"]: d for d in nan_alert["deliveries"]}
            assert set(by_status) == {A.DELIVERED, A.FAILED}, nan_alert["deliveries"]
            assert (
                by_status[A.FAILED]["attempts"] == 2
                and by_status[A.FAILED]["last_error"] == "no complete answer within 1 s"
            )
            assert all(d["sink"].startswith("webhook:127.0.0.1/") for d in nan_alert["deliveries"])  # no URL

            # The CLI says the same, as JSON and as a table with a delivery column.
            db = (
                ["--database-url", live.database_url]
                if live.database_url
                else ["--data-dir", str(live.data_dir)]
            )
            runner = CliRunner()
            listed = runner.invoke(
                cli, ["alerts", "list", str(run_id), "--json", *db], env={"COLUMNS": "250"}
            )
            assert listed.exit_code == 0, listed.output
            cli_alert = next(a for a in json.loads(listed.output) if a["kind"] == F.NONFINITE_GRAD)
            assert {d["status"] for d in cli_alert["deliveries"]} == {A.DELIVERED, A.FAILED}
            table = runner.invoke(cli, ["alerts", "list", str(run_id), *db], env={"COLUMNS": "250"})
            assert table.exit_code == 0, table.output
            assert "delivery" in table.output and "delivered" in table.output
            assert "failed (2 attempts, no complete answer within 1 s)" in table.output


# -- import --notify ----------------------------------------------------------------------------------


def test_import_notify_goes_through_the_configured_sinks_and_records_delivery(
    tmp_path: Path, db_url: str, receiver: Receiver
) -> None:
    """`lldmon import --notify` uses the service's Settings (same LLDMON_* variables as `serve`): the
    minimum severity applies, the payload carries the dashboard link, and delivery is recorded."""
    from monitor.importers import VERL_NAMES

    verl_name = {canonical: raw for raw, canonical in reversed(VERL_NAMES.items())}
    scenario = collapse_scenario(3)
    rows = []
    for i, step in enumerate(scenario.steps.tolist()):
        data = {
            verl_name.get(name, name): float(values[i])
            for name, values in scenario.values.items()
            if scenario.present[name][i] and np.isfinite(values[i])
        }
        rows.append(json.dumps({"step": step, "data": data}) + "\n")
    path = tmp_path / "collapse.jsonl"
    path.write_text("".join(rows))
    env = {
        "LLDMON_WEBHOOK_URLS": json.dumps([receiver.url]),
        "LLDMON_WEBHOOK_MIN_SEVERITY": "critical",
        "LLDMON_PUBLIC_URL": "https://lldmon.example.org",
    }
    runner = CliRunner()
    base = ["import", str(path), "--project", "nq", "--database-url", db_url, "--format", "verl-jsonl"]
    assert runner.invoke(cli, [*base, "--run", "quiet"], env=env).exit_code == 0
    assert receiver.requests == []
    loud = runner.invoke(cli, [*base, "--run", "loud", "--notify"], env=env)
    assert loud.exit_code == 0, loud.output
    bodies = receiver.bodies
    assert bodies and all(b["severity"] == "critical" for b in bodies)
    assert all(b["dashboard_url"].startswith("https://lldmon.example.org/dashboard/run/") for b in bodies)
    listed = runner.invoke(cli, ["alerts", "list", "loud", "--json", "--database-url", db_url])
    assert listed.exit_code == 0, listed.output
    sent = {b["alert_id"] for b in bodies}
    for alert in json.loads(listed.output):
        statuses = [d["status"] for d in alert["deliveries"]]
        assert statuses == ([A.DELIVERED] if alert["id"] in sent else []), alert


# -- migration 0005 -----------------------------------------------------------------------------------


def test_alert_delivery_migration_up_down_up_with_data(empty_url: str) -> None:
    upgrade(empty_url, "0005")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        conn.execute(
            text(
                "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                "VALUES (1, 1, 'r', '{}', 'running', 'alert')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO alerts (id, run_id, kind, severity, status, message, evidence, first_step, "
                "last_step) VALUES (1, 1, 'lld_decay', 'warning', 'open', 'm', '{}', 5, 5)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO alert_deliveries (alert_id, sink, event, status, attempts) "
                "VALUES (1, 'webhook:h/1', 'firing', 'delivered', 1)"
            )
        )
    downgrade(empty_url, "0004")
    assert "alert_deliveries" not in inspect(engine).get_table_names()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alerts")).scalar_one() == 1  # alerts stay
    upgrade(empty_url)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM alert_deliveries")).scalar_one() == 0
        conn.execute(
            text(
                "INSERT INTO alert_deliveries (alert_id, sink, event, status) "
                "VALUES (1, 'slack:h/2', 'escalated', 'pending')"
            )
        )
    with pytest.raises(Exception, match=r"(?i)check|constraint"), engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO alert_deliveries (alert_id, sink, event, status) VALUES (1, 'x', 'firing', 'lost')"
            )
        )
    with engine.begin() as conn:  # deleting the alert deletes its delivery state
        conn.execute(text("DELETE FROM alerts"))
        assert conn.execute(text("SELECT count(*) FROM alert_deliveries")).scalar_one() == 0
    engine.dispose()


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("LLDMON_WEBHOOK_MIN_SEVERITY", "urgent", "LLDMON_WEBHOOK_MIN_SEVERITY"),
        ("LLDMON_SINK_MAX_ATTEMPTS", "0", "LLDMON_SINK_MAX_ATTEMPTS"),
        ("LLDMON_WEBHOOK_URLS", "http://not-a-json-list", "webhook_urls"),
    ],
)
def test_bad_sink_setting_is_one_line_exit_2(tmp_path: Path, variable: str, value: str, named: str) -> None:
    result = CliRunner().invoke(
        cli, ["alerts", "list", "1", "--data-dir", str(tmp_path)], env={variable: value, "COLUMNS": "250"}
    )
    assert result.exit_code == 2, result.output
    assert named in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
