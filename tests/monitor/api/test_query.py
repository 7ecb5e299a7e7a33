"""Query side: history with step range and downsampling, CSV, names, directives, alerts, events."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from tests.conftest import ALL_BACKENDS, migrated_database
from tests.monitor.api.helpers import history, metrics_batch, new_run


# Also run on PostgreSQL hash-partitioned by run_id (docs/scale-out.md); the two overrides go together.
@pytest.fixture(scope="session", params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def migrated_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from migrated_database(backend, tmp_path_factory)


def seed(client: TestClient, run_id: int, n: int) -> None:
    values: list[float | str] = [float(i % 7) for i in range(n)]
    values[n // 2] = 1000.0  # a grad-norm spike that downsampling must keep
    values[n // 3] = "NaN"
    client.post(
        f"{API_PREFIX}/runs/{run_id}/metrics",
        json=metrics_batch(list(range(n)), {"grad/norm": values, "reward/mean": [0.5] * n}),
    )


def test_step_range_and_names(client: TestClient) -> None:
    run_id = new_run(client)
    seed(client, run_id, 50)
    series = history(client, run_id, names=["reward/mean"], step_min=10, step_max=12)
    assert series == {"reward/mean": {"steps": [10, 11, 12], "values": [0.5, 0.5, 0.5]}}
    assert history(client, run_id, names=["nope"]) == {}
    bad = client.get(f"{API_PREFIX}/runs/{run_id}/metrics", params={"step_min": 5, "step_max": 1})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "step_min"
    assert client.get(f"{API_PREFIX}/runs/{run_id}/metrics", params={"step_min": -1}).status_code == 422


def test_downsampling_keeps_spikes_and_nan(client: TestClient) -> None:
    run_id = new_run(client)
    seed(client, run_id, 3000)
    series = history(client, run_id, names=["grad/norm"], max_points=100)["grad/norm"]
    assert len(series["steps"]) <= 100
    assert series["steps"] == sorted(series["steps"])
    assert 1000.0 in series["values"] and "NaN" in series["values"]
    assert series["steps"][0] == 0 and series["steps"][-1] == 2999


def test_csv_export(client: TestClient) -> None:
    run_id = new_run(client)
    client.post(
        f"{API_PREFIX}/runs/{run_id}/metrics",
        json=metrics_batch([0, 1], {"b": [1.0, 2.0], "a": [None, 3.0]}),
    )
    response = client.get(f"{API_PREFIX}/runs/{run_id}/metrics", params={"format": "csv"})
    assert response.headers["content-type"].startswith("text/csv")
    assert response.text.splitlines() == ["step,a,b", "0,,1.0", "1,3.0,2.0"]


def test_metric_names(client: TestClient) -> None:
    run_id = new_run(client)
    seed(client, run_id, 20)
    names = client.get(f"{API_PREFIX}/runs/{run_id}/metric-names").json()
    assert names == [
        {"name": "grad/norm", "points": 20, "first_step": 0, "last_step": 19},
        {"name": "reward/mean", "points": 20, "first_step": 0, "last_step": 19},
    ]


def test_directive_default_override_and_history(client: TestClient) -> None:
    run_id = new_run(client)
    url = f"{API_PREFIX}/runs/{run_id}/directive"
    default = client.get(url).json()
    assert default["version"] == 0 and default["llds"] == {"enabled": False, "lam": 0.2}
    on = client.put(url, json={"llds": {"enabled": True, "lam": 0.3}, "reason": "decay since step 80"}).json()
    assert on["version"] == 1 and on["llds"] == {"enabled": True, "lam": 0.3}
    assert on["source"] == "manual" and on["reason"] == "decay since step 80"
    off = client.put(url, json={"llds": {"enabled": False}}).json()
    assert off["version"] == 2 and off["reason"] == "manual override"
    assert client.get(url).json()["version"] == 2
    versions = client.get(f"{API_PREFIX}/runs/{run_id}/directives").json()
    assert [d["llds"]["enabled"] for d in versions] == [True, False]
    assert client.put(url, json={"llds": {"enabled": True, "lam": -1}}).status_code == 422


def test_alerts_and_events_start_empty(client: TestClient) -> None:
    run_id = new_run(client)
    assert client.get(f"{API_PREFIX}/runs/{run_id}/alerts").json() == []
    assert client.get(f"{API_PREFIX}/runs/{run_id}/events").json() == []
    assert client.get(f"{API_PREFIX}/runs/{run_id}/alerts", params={"status": "bogus"}).status_code == 422
    assert client.get(f"{API_PREFIX}/runs/77/alerts").status_code == 404


def test_csv_quotes_names_and_aligns_sparse_series(client: TestClient) -> None:
    run_id = new_run(client)
    client.post(
        f"{API_PREFIX}/runs/{run_id}/metrics",
        json=metrics_batch([0, 5, 9], {'odd,"name"': [1.5, None, "-Infinity"], "z": [None, 2.0, None]}),
    )
    text = client.get(f"{API_PREFIX}/runs/{run_id}/metrics", params={"format": "csv"}).text
    assert text.splitlines() == ['step,"odd,""name""",z', "0,1.5,", "5,,2.0", "9,-Infinity,"]


def test_run_summary_is_the_run_at_a_glance_without_its_history(client: TestClient) -> None:
    """`GET /runs/{id}/summary` (what `lldmon runs show --url` reads): step extent over all metrics,
    each metric's last value (a logged NaN stays NaN), the directive in force."""
    run_id = new_run(client, "glance")
    client.post(
        f"{API_PREFIX}/runs/{run_id}/metrics",
        json=metrics_batch([3, 5, 9], {"reward/mean": [0.1, 0.2, None], "grad/norm": [1.0, None, "NaN"]}),
    ).raise_for_status()
    body = client.get(f"{API_PREFIX}/runs/{run_id}/summary").json()
    assert body["run"]["id"] == run_id and body["run"]["name"] == "glance"
    assert body["steps"] == {"count": 3, "first": 3, "last": 9}
    metrics = {m["name"]: m for m in body["metrics"]}
    assert metrics["reward/mean"]["last_step"] == 5 and metrics["reward/mean"]["last_value"] == 0.2
    assert metrics["grad/norm"]["points"] == 2 and metrics["grad/norm"]["last_value"] == "NaN"
    assert body["directive"]["version"] == 0 and body["directives"] == []
    assert client.get(f"{API_PREFIX}/runs/{run_id + 1000}/summary").status_code == 404
