"""Closed loop through the API: a run that slides into collapse gets phase events, alerts, webhooks,
Prometheus phase gauges and, under the `auto` policy only, the LLDS directive."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX, encode_float
from lldmon_lab.scenarios import Scenario, collapse_scenario, healthy_scenario
from monitor.api.app import create_app
from tests.monitor.alerting.test_sinks import Receiver


def stream(
    client: TestClient, run_id: int, scenario: Scenario, batch_steps: int = 10
) -> list[dict[str, Any]]:
    """Send the scenario as a trainer would: batches of consecutive steps; returns the acks."""
    acks = []
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
        acks.append(response.json())
    return acks


@pytest.fixture
def receiver():  # type: ignore[no-untyped-def]
    r = Receiver(failures=1)
    yield r
    r.close()


@pytest.fixture
def alerting_client(settings, receiver):  # type: ignore[no-untyped-def]
    app = create_app(settings.model_copy(update={"webhook_urls": [receiver.url]}))
    with TestClient(app) as client:
        yield client, app
    app.state.lldmon.db.dispose()


def test_collapse_under_auto_policy_switches_llds_on(alerting_client, receiver) -> None:  # type: ignore[no-untyped-def]
    client, app = alerting_client
    scenario = collapse_scenario(3)
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "grpo-auto"}).json()["id"]
    client.put(f"{API_PREFIX}/runs/{run_id}/policy", json={"policy": "auto"})
    acks = stream(client, run_id, scenario)

    events = client.get(f"{API_PREFIX}/runs/{run_id}/events").json()
    phases = [e["phase"] for e in events]
    assert "decay" in phases and "collapse" in phases
    decay = next(e for e in events if e["phase"] == "decay")
    assert decay["evidence"] and decay["step"] < scenario.collapse_step  # type: ignore[operator]
    # Evidence in words next to the raw evidence: a headline, statistics by name, no internal keys.
    collapse = next(e for e in events if e["phase"] == "collapse")
    assert collapse["explanation"][0].startswith(f"{collapse['previous_phase']} → collapse at step ")
    assert any(" = " in line and "threshold" in line for line in collapse["explanation"][1:])
    for event in events:
        assert not any(k in line for k in ("active_at", "degraded:", "{") for line in event["explanation"])

    alerts = client.get(f"{API_PREFIX}/runs/{run_id}/alerts").json()
    kinds = {a["kind"]: a for a in alerts}
    assert kinds["lld_decay"]["severity"] == "warning"
    assert kinds["lld_collapse"]["severity"] == "critical"
    assert len([a for a in alerts if a["kind"] == "lld_collapse"]) == 1  # de-duplicated
    assert all(a["explanation"] and "evidence" in a for a in alerts)
    assert not any("degraded" in line for a in alerts for line in a["explanation"])  # hooks present

    # The directive flipped during the stream and the trainer saw it in an ingest acknowledgement.
    enabled = [a for a in acks if a["directive"]["llds"]["enabled"]]
    assert enabled and enabled[0]["directive"]["source"] == "detector"
    assert enabled[0]["directive"]["llds"]["lam"] == pytest.approx(0.2)
    first_on = acks.index(enabled[0])
    assert first_on * 10 < scenario.collapse_step  # type: ignore[operator]
    history = client.get(f"{API_PREFIX}/runs/{run_id}/directives").json()
    assert history[0]["reason"].startswith("auto: run entered")

    assert app.state.lldmon.dispatcher.join(10)
    fired = [b for b in receiver.bodies if b["event"] in ("firing", "escalated")]
    assert {"lld_decay", "lld_collapse"} <= {b["kind"] for b in fired}
    assert ("escalated", "lld_collapse") in {(b["event"], b["kind"]) for b in fired}  # decay got worse
    assert all(b["run_name"] == "grpo-auto" for b in fired)
    assert all(b["explanation"] and b["evidence"] for b in fired)  # words for people, raw for machines

    run = client.get(f"{API_PREFIX}/runs/{run_id}").json()
    assert run["phase"] == "collapse"
    metrics = client.get("/metrics").text
    assert (
        f'lldmon_run_phase{{phase="collapse",project="default",run="grpo-auto",run_id="{run_id}"}} 1.0'
        in metrics
    )
    assert 'lldmon_alerts_fired_total{kind="lld_collapse",severity="critical"} 1.0' in metrics


def test_alert_policy_alerts_but_never_steers(client: TestClient) -> None:
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "grpo-alert"}).json()["id"]
    acks = stream(client, run_id, collapse_scenario(3))
    assert not any(a["directive"]["llds"]["enabled"] for a in acks)
    assert client.get(f"{API_PREFIX}/runs/{run_id}/directive").json()["version"] == 0
    assert any(a["kind"] == "lld_collapse" for a in client.get(f"{API_PREFIX}/runs/{run_id}/alerts").json())


def test_healthy_run_raises_no_collapse_alert(client: TestClient) -> None:
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "healthy", "tags": []}).json()["id"]
    client.put(f"{API_PREFIX}/runs/{run_id}/policy", json={"policy": "auto"})
    stream(client, run_id, healthy_scenario(1))
    alerts = client.get(f"{API_PREFIX}/runs/{run_id}/alerts").json()
    assert not [a for a in alerts if a["severity"] == "critical"]
    assert client.get(f"{API_PREFIX}/runs/{run_id}/directive").json()["llds"]["enabled"] is False


def test_acknowledge_and_overrides(client: TestClient) -> None:
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "ack"}).json()["id"]
    stream(client, run_id, collapse_scenario(3))
    alert = client.get(f"{API_PREFIX}/runs/{run_id}/alerts", params={"status": "open"}).json()[0]
    acked = client.post(f"{API_PREFIX}/runs/{run_id}/alerts/{alert['id']}/ack").json()
    assert acked["status"] == "acknowledged" and acked["acknowledged_at"]
    assert client.post(f"{API_PREFIX}/runs/{run_id}/alerts/99999/ack").status_code == 404
    bad = client.put(f"{API_PREFIX}/runs/{run_id}/detector", json={"overrides": {"no_such_knob": 1}})
    assert bad.status_code == 422 and "no_such_knob" in bad.json()["error"]["message"]


def test_late_batch_of_old_steps_does_not_rewind_the_detector(client: TestClient) -> None:
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "late"}).json()["id"]
    scenario = collapse_scenario(5)
    stream(client, run_id, scenario)
    events_before = client.get(f"{API_PREFIX}/runs/{run_id}/events").json()
    body = {"batch_id": "late", "steps": [1, 2], "metrics": {"reward/mean": [0.1, 0.2]}}
    assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).status_code == 200
    assert client.get(f"{API_PREFIX}/runs/{run_id}/events").json() == events_before


def test_transient_nonfinite_grad_inside_one_batch_still_alerts(client: TestClient) -> None:
    """Regression: a NaN grad norm that started and cleared inside one batch was never alerted."""
    import dataclasses

    import numpy as np

    from contracts.metrics import GRAD_NORM

    scenario = healthy_scenario(2)
    grad = scenario.values[GRAD_NORM].copy()
    grad[45] = np.nan
    scenario = dataclasses.replace(scenario, values={**scenario.values, GRAD_NORM: grad})
    run_id = client.post(f"{API_PREFIX}/runs", json={"name": "nan-blip"}).json()["id"]
    stream(client, run_id, scenario, batch_steps=20)
    alerts = client.get(f"{API_PREFIX}/runs/{run_id}/alerts").json()
    nan_alerts = [a for a in alerts if a["kind"] == "nonfinite_grad"]
    assert len(nan_alerts) == 1
    assert nan_alerts[0]["severity"] == "critical" and nan_alerts[0]["first_step"] == int(scenario.steps[45])
    assert nan_alerts[0]["status"] == "resolved"  # the run went on with finite gradients


def test_a_declared_reward_floor_is_used_from_the_first_steps(client: TestClient) -> None:
    """A reward that collapses at step 12, before a scale-free run has measured its noise: with the
    design's floor declared (`reward_floor` override), the service pages; without it, it waits."""
    steps = list(range(40))
    reward = [0.3] * 12 + [0.0] * 28
    grads = [1.0] * 12 + [0.0] * 28
    ids = {}
    for name, overrides in (("declared", {"reward_floor": 0}), ("undeclared", {})):
        run_id = client.post(f"{API_PREFIX}/runs", json={"name": name}).json()["id"]
        ok = client.put(f"{API_PREFIX}/runs/{run_id}/detector", json={"overrides": overrides})
        assert ok.status_code == 200 and ok.json()["overrides"] == overrides
        body = {"batch_id": "b", "steps": steps, "metrics": {"reward/mean": reward, "grad/norm": grads}}
        assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).status_code == 200
        ids[name] = run_id
    declared = client.get(f"{API_PREFIX}/runs/{ids['declared']}/alerts").json()
    assert {"reward_zero", "dead_run"} & {a["kind"] for a in declared if a["severity"] == "critical"}
    undeclared = client.get(f"{API_PREFIX}/runs/{ids['undeclared']}/alerts").json()
    assert not [a for a in undeclared if a["severity"] == "critical"]
    bad = client.put(
        f"{API_PREFIX}/runs/{ids['declared']}/detector", json={"overrides": {"reward_floor": "x"}}
    )
    assert bad.status_code == 422 and "reward_floor" in bad.json()["error"]["message"]


def test_a_declared_reward_series_is_read_and_judged_by_the_service(client: TestClient) -> None:
    """A composite reward (format + answer) holds level while the answers collapse: with the task-success
    series declared (`reward_metric`, a trainer's own key the detector does not read otherwise) the
    service judges it and pages; the evidence names that series."""
    steps = list(range(40))
    success = [0.3] * 12 + [0.0] * 28
    metrics = {"reward/mean": [1.0] * 40, "rewards/exact_match/mean": success, "grad/norm": [1.0] * 40}
    ids = {}
    for name, overrides in (
        ("declared", {"reward_metric": "rewards/exact_match/mean", "reward_floor": 0}),
        ("undeclared", {}),
    ):
        run_id = client.post(f"{API_PREFIX}/runs", json={"name": name}).json()["id"]
        ok = client.put(f"{API_PREFIX}/runs/{run_id}/detector", json={"overrides": overrides})
        assert ok.status_code == 200 and ok.json()["overrides"] == overrides
        body = {"batch_id": "b", "steps": steps, "metrics": metrics}
        assert client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body).status_code == 200
        ids[name] = run_id
    declared = client.get(f"{API_PREFIX}/runs/{ids['declared']}/alerts").json()
    zero = [a for a in declared if a["kind"] == "reward_zero"]
    assert zero and zero[0]["severity"] == "critical"
    assert "rewards/exact_match/mean" in json.dumps(zero[0])
    undeclared = client.get(f"{API_PREFIX}/runs/{ids['undeclared']}/alerts").json()
    assert not [a for a in undeclared if a["severity"] == "critical"]
    bad = client.put(
        f"{API_PREFIX}/runs/{ids['declared']}/detector", json={"overrides": {"reward_metric": "a\nb"}}
    )
    assert bad.status_code == 422 and "reward_metric" in bad.json()["error"]["message"]
