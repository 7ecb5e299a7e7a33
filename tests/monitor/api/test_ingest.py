"""Ingest: columnar batches, exactly-once re-sends, NaN/inf fidelity, later-wins for resumed runs."""

from __future__ import annotations

import gzip
import json
import math
import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from contracts.wire import API_PREFIX
from tests.conftest import ALL_BACKENDS, migrated_database
from tests.monitor.api.helpers import action_batch, history, metrics_batch, new_run


# Also run on PostgreSQL hash-partitioned by run_id (docs/scale-out.md); the two overrides go together.
@pytest.fixture(scope="session", params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def migrated_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from migrated_database(backend, tmp_path_factory)


def post_metrics(client: TestClient, run_id: int, body: object, **kwargs: object):  # type: ignore[no-untyped-def]
    return client.post(f"{API_PREFIX}/runs/{run_id}/metrics", json=body, **kwargs)  # type: ignore[arg-type]


def test_metrics_round_trip_preserves_values_and_missing(client: TestClient) -> None:
    run_id = new_run(client)
    batch = metrics_batch([0, 1, 2], {"reward/mean": [0.1, 0.2, 0.3], "grad/norm": [1.5, None, 2.5]})
    response = post_metrics(client, run_id, batch)
    assert response.status_code == 200
    ack = response.json()
    assert ack == {**ack, "batch_id": batch["batch_id"], "rows": 5, "duplicate": False, "last_step": 2}
    series = history(client, run_id)
    assert series["reward/mean"] == {"steps": [0, 1, 2], "values": [0.1, 0.2, 0.3]}
    # null = not logged at that step: no point at all, not a NaN.
    assert series["grad/norm"] == {"steps": [0, 2], "values": [1.5, 2.5]}
    run = client.get(f"{API_PREFIX}/runs/{run_id}").json()
    assert run["last_step"] == 2


def test_nan_and_inf_tokens_and_strings_round_trip(client: TestClient) -> None:
    run_id = new_run(client)
    raw = (
        b'{"batch_id": "nan-1", "steps": [0, 1, 2, 3], "metrics": {'
        b'"grad/norm": [NaN, Infinity, -Infinity, 1.0], "entropy/mean": ["NaN", "Infinity", "-Infinity", null]}}'
    )
    response = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", content=raw)
    assert response.status_code == 200, response.text
    assert response.json()["rows"] == 7
    series = history(client, run_id)
    assert series["grad/norm"]["values"] == ["NaN", "Infinity", "-Infinity", 1.0]
    assert series["entropy/mean"] == {"steps": [0, 1, 2], "values": ["NaN", "Infinity", "-Infinity"]}
    csv_text = client.get(f"{API_PREFIX}/runs/{run_id}/metrics", params={"format": "csv"}).text
    assert csv_text.splitlines() == [
        "step,entropy/mean,grad/norm",
        "0,NaN,NaN",
        "1,Infinity,Infinity",
        "2,-Infinity,-Infinity",
        "3,,1.0",
    ]


def test_resent_batch_is_stored_once_and_acknowledged(client: TestClient) -> None:
    run_id = new_run(client)
    batch = metrics_batch([5], {"loss": [0.5]}, batch_id="retry-me")
    first = post_metrics(client, run_id, batch).json()
    # The retry is the same batch spelled differently (spacing, gzip): still the same payload.
    respelled = gzip.compress(json.dumps(batch, indent=2).encode())
    second = client.post(
        f"{API_PREFIX}/runs/{run_id}/metrics",
        content=respelled,
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    ).json()
    assert first["duplicate"] is False and second["duplicate"] is True
    assert second["rows"] == first["rows"] == 1
    assert history(client, run_id)["loss"] == {"steps": [5], "values": [0.5]}
    metrics_text = client.get("/metrics").text
    assert 'lldmon_ingest_batches_total{kind="metrics",outcome="duplicate"} 1.0' in metrics_text
    assert 'lldmon_ingest_rows_total{kind="metrics"} 1.0' in metrics_text


def test_concurrent_duplicates_store_once(client: TestClient) -> None:
    run_id = new_run(client)
    batch = metrics_batch(list(range(200)), {"reward/mean": [float(i) for i in range(200)]}, batch_id="race")
    results: list[dict[str, object]] = []

    def send() -> None:
        results.append(post_metrics(client, run_id, batch).json())

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["duplicate"] for r in results) == [False] + [True] * 5
    assert len(history(client, run_id)["reward/mean"]["steps"]) == 200


def test_resumed_run_overwrites_overlapping_steps(client: TestClient) -> None:
    """A run resumed from a checkpoint re-logs steps: the later value wins, nothing is duplicated."""
    run_id = new_run(client)
    post_metrics(client, run_id, metrics_batch([0, 1, 2], {"loss": [3.0, 2.0, 1.0]}))
    ack = post_metrics(client, run_id, metrics_batch([2, 3], {"loss": [1.5, 0.5]})).json()
    assert ack["duplicate"] is False
    assert history(client, run_id)["loss"] == {"steps": [0, 1, 2, 3], "values": [3.0, 2.0, 1.5, 0.5]}


def test_step_repeated_inside_one_batch_keeps_the_later_value(client: TestClient) -> None:
    run_id = new_run(client)
    response = post_metrics(
        client, run_id, metrics_batch([1, 1, 2], {"loss": [1.0, 2.0, 3.0], "kl/ref": [0.1, None, 0.2]})
    )
    assert response.status_code == 200
    series = history(client, run_id)
    assert series["loss"] == {"steps": [1, 2], "values": [2.0, 3.0]}
    assert series["kl/ref"] == {"steps": [1, 2], "values": [0.1, 0.2]}


def test_gzip_body_is_accepted(client: TestClient) -> None:
    run_id = new_run(client)
    body = gzip.compress(json.dumps(metrics_batch([0, 1], {"reward/mean": [0.0, 1.0]})).encode())
    response = client.post(
        f"{API_PREFIX}/runs/{run_id}/metrics",
        content=body,
        headers={"content-encoding": "gzip", "content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert history(client, run_id)["reward/mean"]["values"] == [0.0, 1.0]


def test_response_carries_the_current_directive(client: TestClient) -> None:
    run_id = new_run(client)
    ack = post_metrics(client, run_id, metrics_batch([0], {"loss": [1.0]})).json()
    assert ack["directive"]["llds"] == {"enabled": False, "lam": 0.2}
    client.put(f"{API_PREFIX}/runs/{run_id}/directive", json={"llds": {"enabled": True, "lam": 0.3}})
    ack = post_metrics(client, run_id, metrics_batch([1], {"loss": [1.0]})).json()
    assert ack["directive"]["llds"] == {"enabled": True, "lam": 0.3}
    assert ack["directive"]["version"] == 1


def test_action_records_round_trip(client: TestClient) -> None:
    run_id = new_run(client)
    batch = action_batch(6, step=3)
    batch["delta"][1] = "NaN"
    batch["reward"][2] = None
    response = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=batch)
    assert response.status_code == 200, response.text
    assert response.json()["rows"] == 6
    again = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=batch).json()
    assert again["duplicate"] is True
    stored = client.get(f"{API_PREFIX}/runs/{run_id}/actions", params={"step_min": 3, "step_max": 3}).json()
    assert stored["traj_index"] == list(range(6))
    assert stored["delta"][1] == "NaN"
    assert stored["delta"][0] == 0.0 and math.isclose(stored["delta"][5], -0.5)
    assert stored["reward"][2] == "NaN"  # unknown reward is stored as NaN
    assert stored["is_answer"] == [True, False, False, True, False, False]
    assert stored["source"] == ["loss"] * 6
    assert client.get(f"{API_PREFIX}/runs/{run_id}/actions", params={"source": "probe"}).json()["step"] == []


def test_loss_and_probe_records_of_the_same_action_coexist(client: TestClient) -> None:
    run_id = new_run(client)
    assert (
        client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=action_batch(2, source="loss")).status_code
        == 200
    )
    assert (
        client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=action_batch(2, source="probe")).status_code
        == 200
    )
    stored = client.get(f"{API_PREFIX}/runs/{run_id}/actions").json()
    assert stored["source"] == ["loss", "loss", "probe", "probe"]


def post_combined(client: TestClient, run_id: int, metrics: object, actions: object):  # type: ignore[no-untyped-def]
    body = {"metrics": metrics, "actions": actions}
    return client.post(f"{API_PREFIX}/runs/{run_id}/combined", json=body)


def test_combined_request_stores_both_batches_as_their_own_endpoints_would(client: TestClient) -> None:
    run_id = new_run(client)
    metrics = metrics_batch([3], {"reward/mean": [0.5], "grad/norm": ["Infinity"]})
    actions = action_batch(6, step=3)
    actions["delta"][1] = "NaN"
    response = post_combined(client, run_id, metrics, actions)
    assert response.status_code == 200, response.text
    ack = response.json()
    assert ack["metrics"] == {
        **ack["metrics"],
        "batch_id": metrics["batch_id"],
        "rows": 2,
        "duplicate": False,
        "last_step": 3,
    }
    assert ack["actions"] == {
        **ack["actions"],
        "batch_id": actions["batch_id"],
        "rows": 6,
        "duplicate": False,
        "last_step": None,
    }
    assert ack["metrics"]["directive"] == ack["actions"]["directive"]
    assert history(client, run_id)["grad/norm"] == {"steps": [3], "values": ["Infinity"]}
    stored = client.get(f"{API_PREFIX}/runs/{run_id}/actions").json()
    assert stored["traj_index"] == list(range(6)) and stored["delta"][1] == "NaN"
    assert client.get(f"{API_PREFIX}/runs/{run_id}").json()["last_step"] == 3


def test_combined_and_separate_deliveries_of_one_batch_are_stored_once(client: TestClient) -> None:
    """The client re-sends through the separate endpoints what a combined request may have stored
    (its spool keeps the two halves), and either half may already be stored: each is claimed under
    its own kind and id."""
    run_id = new_run(client)
    metrics, actions = metrics_batch([0], {"loss": [1.0]}), action_batch(4)
    assert post_combined(client, run_id, metrics, actions).status_code == 200
    again_m = post_metrics(client, run_id, metrics).json()
    again_a = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=actions).json()
    assert (again_m["duplicate"], again_m["rows"], again_a["duplicate"], again_a["rows"]) == (
        True,
        1,
        True,
        4,
    )
    # The other way round: the metrics went alone, the combined re-send stores only the actions.
    metrics2, actions2 = metrics_batch([1], {"loss": [2.0]}), action_batch(3, step=1)
    assert post_metrics(client, run_id, metrics2).status_code == 200
    ack = post_combined(client, run_id, metrics2, actions2).json()
    assert (ack["metrics"]["duplicate"], ack["actions"]["duplicate"], ack["actions"]["rows"]) == (
        True,
        False,
        3,
    )
    stored = client.get(f"{API_PREFIX}/runs/{run_id}/actions").json()
    assert stored["step"] == [0] * 4 + [1] * 3
    assert history(client, run_id)["loss"] == {"steps": [0, 1], "values": [1.0, 2.0]}


@pytest.mark.parametrize("bad_half", ["metrics", "actions"])
def test_combined_request_with_one_bad_half_writes_nothing(client: TestClient, bad_half: str) -> None:
    run_id = new_run(client)
    metrics, actions = metrics_batch([0], {"loss": [1.0]}), action_batch(3)
    if bad_half == "metrics":
        metrics["metrics"]["loss"] = [1.0, 2.0]
        field = "metrics.metrics.loss"
    else:
        actions["delta"][2] = "fast"
        field = "actions.delta[2]"
    response = post_combined(client, run_id, metrics, actions)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert history(client, run_id) == {}
    assert client.get(f"{API_PREFIX}/runs/{run_id}/actions").json()["step"] == []
    assert (
        'lldmon_ingest_batches_total{kind="combined",outcome="rejected"} 1.0' in client.get("/metrics").text
    )


def test_combined_request_reusing_an_id_with_another_payload_is_409_and_writes_nothing(
    client: TestClient,
) -> None:
    run_id = new_run(client)
    actions = action_batch(2, batch_id="taken")
    assert client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=actions).status_code == 200
    metrics, other = metrics_batch([0], {"loss": [1.0]}), action_batch(5, batch_id="taken")
    response = post_combined(client, run_id, metrics, other)
    assert response.status_code == 409, response.text
    assert history(client, run_id) == {}  # the metrics half went with the refused transaction
    assert len(client.get(f"{API_PREFIX}/runs/{run_id}/actions").json()["step"]) == 2


# --- bad input: clear error naming the field, nothing written -------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"steps": [0], "metrics": {"loss": [1.0]}}, "batch_id"),
        ({"batch_id": "x", "steps": [-1], "metrics": {"loss": [1.0]}}, "steps[0]"),
        ({"batch_id": "x", "steps": [1.5], "metrics": {"loss": [1.0]}}, "steps[0]"),
        ({"batch_id": "x", "steps": ["1"], "metrics": {"loss": [1.0]}}, "steps[0]"),
        ({"batch_id": "x", "steps": [0, 1], "metrics": {"loss": [1.0]}}, "metrics.loss"),
        ({"batch_id": "x", "steps": [0], "metrics": {"loss": ["fast"]}}, "metrics.loss"),
        ({"batch_id": "x", "steps": [0], "metrics": {"loss": [True]}}, "metrics"),
        ({"batch_id": "x", "steps": [0], "metrics": {"": [1.0]}}, "metrics."),
        ({"batch_id": "x", "steps": [0], "metrics": {"loss": [1.0]}, "extra": 1}, "extra"),
        ({"batch_id": "bad id with spaces", "steps": [0], "metrics": {}}, "batch_id"),
        ({"batch_id": "x", "steps": 3, "metrics": {}}, "steps"),
    ],
)
def test_bad_metrics_batch_is_rejected_and_nothing_written(
    client: TestClient, body: dict[str, object], field: str
) -> None:
    run_id = new_run(client)
    # A valid column next to the bad one: it must not be half-written.
    if isinstance(body.get("metrics"), dict):
        body["metrics"] = {
            "reward/mean": [0.5] * len(body["steps"]) if isinstance(body["steps"], list) else [],
            **body["metrics"],
        }  # type: ignore[dict-item, arg-type]
    response = post_metrics(client, run_id, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["field"].startswith(field)
    assert history(client, run_id) == {}


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"", b"[]", b'{"batch_id": "x", "steps": [0], "metrics": {"loss": [1.0]}', b"\xff\xfe"],
)
def test_malformed_json_is_422(client: TestClient, raw: bytes) -> None:
    run_id = new_run(client)
    response = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", content=raw)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"


@pytest.mark.parametrize(
    ("column", "value", "field"),
    [
        ("traj_index", [0, 1], "traj_index"),
        ("source", ["loss", "rollout", "loss"], "source[1]"),
        ("is_answer", [True, "yes", False], "is_answer[1]"),
        ("step", [0, -2, 0], "step[1]"),
        ("delta", [0.0, "bogus", 1.0], "delta[1]"),
    ],
)
def test_bad_action_batch_names_the_column(
    client: TestClient, column: str, value: list[object], field: str
) -> None:
    run_id = new_run(client)
    batch = action_batch(3)
    batch[column] = value
    response = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=batch)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert client.get(f"{API_PREFIX}/runs/{run_id}/actions").json()["step"] == []


def test_unknown_run_is_404(client: TestClient) -> None:
    response = post_metrics(client, 4242, metrics_batch([0], {"loss": [1.0]}))
    assert response.status_code == 404
    assert "4242" in response.json()["error"]["message"]
    assert client.post(f"{API_PREFIX}/runs/4242/actions", json=action_batch(1)).status_code == 404


def test_body_over_limit_is_413_before_reading(client: TestClient) -> None:
    """The limit (1 MiB in tests) is checked on Content-Length and while streaming."""
    run_id = new_run(client)
    steps = list(range(120_000))
    big = metrics_batch(steps, {"reward/mean": [0.123456789] * len(steps)})
    response = post_metrics(client, run_id, big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(40):
            yield b" " * 65536  # streamed without Content-Length

    response = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", content=chunks())
    assert response.status_code == 413
    assert history(client, run_id) == {}


def test_gzip_bomb_is_413(client: TestClient) -> None:
    run_id = new_run(client)
    bomb = gzip.compress(b" " * (8 * 1024 * 1024))
    assert len(bomb) < 1024 * 1024
    response = client.post(
        f"{API_PREFIX}/runs/{run_id}/metrics", content=bomb, headers={"content-encoding": "gzip"}
    )
    assert response.status_code == 413


def test_corrupt_gzip_and_unknown_encoding_are_422(client: TestClient) -> None:
    run_id = new_run(client)
    r1 = client.post(
        f"{API_PREFIX}/runs/{run_id}/metrics", content=b"not gzip", headers={"content-encoding": "gzip"}
    )
    r2 = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", content=b"{}", headers={"content-encoding": "br"})
    assert r1.status_code == r2.status_code == 422


def test_rejected_batches_are_counted(client: TestClient) -> None:
    run_id = new_run(client)
    post_metrics(client, run_id, {"batch_id": "x", "steps": [-1], "metrics": {}})
    assert 'lldmon_ingest_batches_total{kind="metrics",outcome="rejected"} 1.0' in client.get("/metrics").text


def test_ingest_round_trips_to_the_database_are_bounded(client: TestClient, app) -> None:  # type: ignore[no-untyped-def]
    """Connection checkouts per request, after the token lookup (one read, so a revoked token stops at
    once): a metrics batch is one write transaction (run check, ledger, rows) plus the detector's, which
    also reads the directive for the acknowledgement; an actions batch or a re-send is one; a combined
    request is what its metrics batch is."""
    from sqlalchemy import event

    from contracts import metrics as M

    run_id = new_run(client)
    checkouts: list[int] = []
    pool = app.state.lldmon.db.engine.pool

    def count(*_args: object) -> None:
        checkouts.append(1)

    event.listen(pool, "checkout", count)
    try:
        batch = metrics_batch([0, 1], {M.REWARD_MEAN: [0.1, 0.2], M.GRAD_NORM: [1.0, 1.1]})
        assert post_metrics(client, run_id, batch).json()["directive"]["version"] == 0
        assert len(checkouts) == 1 + 2
        checkouts.clear()
        assert post_metrics(client, run_id, batch).json()["duplicate"] is True
        assert len(checkouts) == 1 + 1
        checkouts.clear()
        response = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=action_batch(4))
        assert response.status_code == 200 and "directive" in response.json()
        assert len(checkouts) == 1 + 1
        checkouts.clear()
        step = metrics_batch([2], {M.REWARD_MEAN: [0.3]})
        assert post_combined(client, run_id, step, action_batch(4, step=2)).status_code == 200
        assert len(checkouts) == 1 + 2  # a metrics batch's, the actions riding in its transaction
    finally:
        event.remove(pool, "checkout", count)
