"""healthz, readyz (database reachable) and Prometheus /metrics."""

from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from monitor.api.app import assemble_state
from monitor.db.engine import make_engine
from monitor.store import Database
from tests.monitor.api.helpers import metrics_batch, new_run


def test_healthz_and_readyz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready", "database": "ok"}


def test_readyz_is_503_when_the_database_is_unreachable(client: TestClient, app) -> None:  # type: ignore[no-untyped-def]
    state = app.state.lldmon
    unreachable = Database(make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"))
    app.state.lldmon = dataclasses.replace(state, db=unreachable)
    try:
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["database"] == "unreachable"
    finally:
        app.state.lldmon = state
        unreachable.dispose()


def test_prometheus_metrics(client: TestClient) -> None:
    run_id = new_run(client)
    client.post(f"/api/v1/runs/{run_id}/metrics", json=metrics_batch([0, 1], {"loss": [1.0, 2.0]}))
    text = client.get("/metrics").text
    assert 'lldmon_ingest_batches_total{kind="metrics",outcome="stored"} 1.0' in text
    assert 'lldmon_ingest_rows_total{kind="metrics"} 2.0' in text
    assert 'lldmon_ingest_latency_seconds_count{kind="metrics"} 1.0' in text
    assert 'lldmon_runs{status="running"} 1.0' in text


def test_openapi_documents_the_columnar_bodies(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/api/v1/runs/{run_id}/metrics"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("MetricsBatchWire")
    assert set(schema["components"]["schemas"]["ActionsBatchWire"]["required"]) >= {
        "batch_id",
        "step",
        "delta",
    }
    assert client.get("/docs").status_code == 200
    for out in ("AlertOut", "PhaseEventOut"):  # the evidence in words, next to the raw evidence
        props = schema["components"]["schemas"][out]["properties"]
        assert props["explanation"]["type"] == "array" and props["explanation"]["items"] == {"type": "string"}
        assert "evidence" in props


def test_api_answers_503_while_the_database_is_down(client: TestClient, app) -> None:  # type: ignore[no-untyped-def]
    run_id = new_run(client)
    state = app.state.lldmon
    down = Database(make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"))
    app.state.lldmon = assemble_state(state.settings, down, CollectorRegistry())
    try:
        response = client.post(f"/api/v1/runs/{run_id}/metrics", json=metrics_batch([0], {"loss": [1.0]}))
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "service_unavailable"
        assert "nobody" not in response.text  # no driver message leaks to clients
    finally:
        app.state.lldmon = state
        down.dispose()


def test_metrics_needs_the_scrape_token_when_one_is_set(settings) -> None:  # type: ignore[no-untyped-def]
    """Run names appear in the phase series, so a deployment can close /metrics to strangers."""
    from monitor.api.app import create_app

    app = create_app(settings.model_copy(update={"metrics_token": SecretStr("scrape-s3cret")}))
    try:
        with TestClient(app) as client:
            assert client.get("/metrics").status_code == 401
            assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
            ok = client.get("/metrics", headers={"Authorization": "Bearer scrape-s3cret"})
            assert ok.status_code == 200 and "lldmon_ingest_batches_total" in ok.text
            assert client.get("/healthz").status_code == 200  # probes stay open
    finally:
        app.state.lldmon.db.dispose()
