"""Liveness: a silent run becomes stalled, then crashed, with a run_stalled alert; a batch or heartbeat
revives it. In-process on both databases (the sweeper is driven with an explicit `now`), plus the
migration and /metrics."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from contracts.wire import ALERT_RUN_STALLED
from monitor.db.engine import make_engine
from monitor.db.migrate import downgrade, upgrade
from monitor.services.liveness import LivenessService


def _service(client: TestClient) -> LivenessService:
    service: LivenessService = client.app.state.lldmon.liveness  # type: ignore[attr-defined]
    return service


def _run(client: TestClient, name: str = "r") -> int:
    return int(client.post("/api/v1/runs", json={"name": name, "project": "p"}).json()["id"])


def _log(client: TestClient, run_id: int, batch: str, steps: list[int]) -> None:
    body = {"batch_id": batch, "steps": steps, "metrics": {"reward/mean": [0.5] * len(steps)}}
    assert client.post(f"/api/v1/runs/{run_id}/metrics", json=body).status_code == 200


def _later(seconds: float) -> datetime:
    return datetime.now(timezone.utc) + timedelta(seconds=seconds)


def _stalled_alerts(client: TestClient, run_id: int) -> list[dict[str, Any]]:
    alerts = client.get(f"/api/v1/runs/{run_id}/alerts").json()
    return [a for a in alerts if a["kind"] == ALERT_RUN_STALLED]


def test_silent_run_stalls_then_crashes_and_a_heartbeat_revives_it(client: TestClient) -> None:
    run_id = _run(client)
    _log(client, run_id, "b1", [1, 2])
    put = client.put(f"/api/v1/runs/{run_id}/liveness", json={"stall_after_s": 60, "crash_after_s": 300})
    assert put.status_code == 200 and put.json()["effective_stall_after_s"] == 60
    service = _service(client)

    assert service.sweep(_later(30)) == []
    assert service.sweep(_later(61)) == [(run_id, "stalled")]
    assert service.sweep(_later(62)) == []  # no second transition, no second alert
    assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "stalled"
    (alert,) = _stalled_alerts(client, run_id)
    assert alert["status"] == "open" and alert["severity"] == "warning"

    assert service.sweep(_later(301)) == [(run_id, "crashed")]
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "crashed" and run["finished_at"] is not None
    (alert,) = _stalled_alerts(client, run_id)
    assert alert["status"] == "open" and alert["severity"] == "critical"  # escalated, same alert

    beat = client.post(f"/api/v1/runs/{run_id}/heartbeat")
    assert beat.status_code == 200 and beat.json()["status"] == "running"
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "running" and run["finished_at"] is None
    assert [a["status"] for a in _stalled_alerts(client, run_id)] == ["resolved"]


def test_a_new_batch_revives_a_stalled_run_and_the_sweeper_resolves_its_alert(client: TestClient) -> None:
    run_id = _run(client)
    client.put(f"/api/v1/runs/{run_id}/liveness", json={"stall_after_s": 60})
    service = _service(client)
    assert service.sweep(_later(61)) == [(run_id, "stalled")]
    _log(client, run_id, "b1", [1])
    assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "running"
    assert service.sweep() == []
    assert [a["status"] for a in _stalled_alerts(client, run_id)] == ["resolved"]


def test_finishing_a_stalled_run_resolves_its_alert(client: TestClient) -> None:
    """The job came back only to say it ended (or `lldmon sync` delivered its final status): the
    silence is explained, the run_stalled alert must not stay open for ever."""
    run_id = _run(client)
    client.put(f"/api/v1/runs/{run_id}/liveness", json={"stall_after_s": 60})
    assert _service(client).sweep(_later(61)) == [(run_id, "stalled")]
    assert [a["status"] for a in _stalled_alerts(client, run_id)] == ["open"]
    assert (
        client.post(f"/api/v1/runs/{run_id}/finish", json={"status": "failed"}).json()["status"] == "failed"
    )
    assert [a["status"] for a in _stalled_alerts(client, run_id)] == ["resolved"]


def test_finished_runs_are_left_alone(client: TestClient) -> None:
    run_id = _run(client)
    client.post(f"/api/v1/runs/{run_id}/finish", json={"status": "finished"})
    assert _service(client).sweep(_later(10 * 24 * 3600)) == []
    assert client.get(f"/api/v1/runs/{run_id}").json()["status"] == "finished"
    assert client.post(f"/api/v1/runs/{run_id}/heartbeat").json()["status"] == "finished"


def test_default_thresholds_scale_with_the_median_step(client: TestClient) -> None:
    """Default: max(15 min, 10 x median seconds per step), crash 4x that."""
    run_id = _run(client)
    live = client.get(f"/api/v1/runs/{run_id}/liveness").json()
    assert live["stall_after_s"] is None and live["effective_stall_after_s"] == 900
    assert live["effective_crash_after_s"] == 3600
    state = client.app.state.lldmon  # type: ignore[attr-defined]
    with state.db.write() as conn:  # steps of 200 s each
        conn.execute(
            text("UPDATE runs SET step_intervals = :v WHERE id = :id"), {"v": "[200, 190, 210]", "id": run_id}
        )
    live = client.get(f"/api/v1/runs/{run_id}/liveness").json()
    assert live["median_step_s"] == 200 and live["effective_stall_after_s"] == 2000
    assert _service(client).sweep(_later(1000)) == []  # 1000 s is five steps, not a stall


def test_step_intervals_are_measured_from_batches(client: TestClient) -> None:
    run_id = _run(client)
    _log(client, run_id, "b1", [1, 2])
    _log(client, run_id, "b2", [3, 4])
    live = client.get(f"/api/v1/runs/{run_id}/liveness").json()
    assert live["median_step_s"] is not None and 0 <= live["median_step_s"] < 5
    assert live["last_step_at"] is not None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stall_after_s": -1}, "stall_after_s"),
        ({"stall_after_s": 0}, "stall_after_s"),
        ({"crash_after_s": "soon"}, "crash_after_s"),
        ({"stall_after_s": 1e12}, "stall_after_s"),
        ({"stall_after_s": 60, "crash_after_s": 30}, "crash_after_s"),
        ({"stall_after_s": 60, "typo": 1}, "typo"),
    ],
)
def test_bad_thresholds_are_a_422_naming_the_field(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    run_id = _run(client)
    response = client.put(f"/api/v1/runs/{run_id}/liveness", json=body)
    assert response.status_code == 422
    assert field in response.text
    assert client.get(f"/api/v1/runs/{run_id}/liveness").json()["stall_after_s"] is None  # nothing saved


def test_unknown_run_is_a_404(client: TestClient) -> None:
    assert client.post("/api/v1/runs/999/heartbeat").status_code == 404
    assert client.put("/api/v1/runs/999/liveness", json={"stall_after_s": 5}).status_code == 404


def test_stalled_is_not_a_finish_status(client: TestClient) -> None:
    run_id = _run(client)
    assert client.post(f"/api/v1/runs/{run_id}/finish", json={"status": "stalled"}).status_code == 422
    assert client.get("/api/v1/runs", params={"status": "stalled"}).status_code == 200


def test_metrics_expose_last_step_time_and_project(client: TestClient) -> None:
    run_id = _run(client, "m")
    _log(client, run_id, "b1", [5])
    body = client.get("/metrics").text
    stamp = [line for line in body.splitlines() if line.startswith("lldmon_run_last_step_timestamp_seconds{")]
    assert len(stamp) == 1 and 'project="p"' in stamp[0] and 'run="m"' in stamp[0]
    assert abs(float(stamp[0].split()[-1]) - datetime.now(timezone.utc).timestamp()) < 60
    phase = [line for line in body.splitlines() if line.startswith("lldmon_run_phase{")]
    assert phase and all('project="p"' in line for line in phase)


def test_liveness_migration_up_down_up_with_data(empty_url: str) -> None:
    upgrade(empty_url, "0003")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        conn.execute(
            text(
                "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                "VALUES (1, 1, 'a', '{}', 'running', 'alert'), (2, 1, 'b', '{}', 'crashed', 'alert')"
            )
        )
    upgrade(empty_url, "0004")
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET status = 'stalled', stall_after_s = 5 WHERE id = 1"))
    downgrade(empty_url, "0003")
    assert "stall_after_s" not in {c["name"] for c in inspect(engine).get_columns("runs")}
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status FROM runs ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [(1, "running"), (2, "crashed")]  # stalled -> running
    upgrade(empty_url, "0004")
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET status = 'stalled' WHERE id = 1"))
        assert conn.execute(text("SELECT stall_after_s FROM runs WHERE id = 1")).scalar_one() is None
    engine.dispose()


def test_cli_sets_and_shows_thresholds(settings: Any) -> None:
    from typer.testing import CliRunner

    from monitor.api.app import build_state
    from monitor.cli import app
    from monitor.domain import Principal

    def words(result: Any) -> str:
        return " ".join(result.output.split())

    url = settings.resolved_database_url()
    runner = CliRunner()
    state = build_state(settings)
    run, _ = state.runs.register(Principal(), "cli-run", "p", {}, [])
    state.db.dispose()
    shown = runner.invoke(app, ["runs", "liveness", "cli-run", "--database-url", url])
    assert shown.exit_code == 0 and "stalled after 900 s (default)" in words(shown)
    changed = runner.invoke(
        app, ["runs", "liveness", str(run.id), "--stall-after", "600", "--database-url", url]
    )
    assert changed.exit_code == 0, changed.output
    assert "stalled after 600 s (set on the run)" in words(changed)
    assert "crashed after 2400 s (default)" in words(changed)
    bad = runner.invoke(app, ["runs", "liveness", str(run.id), "--crash-after", "-5", "--database-url", url])
    assert bad.exit_code == 2 and "crash_after_s must be" in words(bad)
    assert "Traceback" not in bad.output
    reset = runner.invoke(app, ["runs", "liveness", str(run.id), "--default", "--database-url", url])
    assert reset.exit_code == 0 and "stalled after 900 s (default)" in words(reset)
