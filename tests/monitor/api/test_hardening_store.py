"""Issue 16, storage side: run configs (depth, size, non-finite values), the batch ledger (kind and
payload) and the detector's work per request. Every test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from typer.testing import CliRunner

from contracts import metrics as M
from contracts.wire import API_PREFIX, encode_float
from lldmon_lab.scenarios import collapse_scenario
from monitor.cli import app as cli_app
from monitor.db.models import Run
from monitor.services.runs import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH
from monitor.store.runs import TOO_DEEP, UNREADABLE
from tests.monitor.api.helpers import action_batch, history, metrics_batch, new_run

RUNS = f"{API_PREFIX}/runs"


def nested(depth: int) -> str:
    """A JSON config of exactly `depth` levels (the config object is level 1)."""
    return '{"a": ' * depth + "1" + "}" * depth


def post_raw(client: TestClient, body: str) -> Any:
    return client.post(RUNS, content=body, headers={"content-type": "application/json"})


def store_config(app: FastAPI, run_id: int, config_json: str) -> None:
    """Write a config as a release before the checks could have stored it (bypassing the service)."""
    engine = app.state.lldmon.db.engine
    value = "CAST(:c AS JSON)" if engine.dialect.name == "postgresql" else ":c"
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE runs SET config = {value} WHERE id = :id"), {"c": config_json, "id": run_id}
        )


# --- 3: deeply nested configs -------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_CONFIG_DEPTH + 1, 500, 900, 930])
def test_config_nested_too_deeply_is_422_naming_config(client: TestClient, depth: int) -> None:
    response = post_raw(client, f'{{"name": "deep", "project": "p", "config": {nested(depth)}}}')
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "body.config"
    assert f"deeper than {MAX_CONFIG_DEPTH} levels" in error["message"]
    listing = client.get(RUNS, params={"project": "p"})
    assert listing.status_code == 200 and listing.json() == []  # nothing half-written


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("config", '{"a": ' + "[" * 900 + "1" + "]" * 900 + "}"),
        ("config", "[" * 900 + "]" * 900),
        ("tags", "[" * 930 + "]" * 930),
        ("name", '{"x": ' * 900 + "1" + "}" * 900),
    ],
)
def test_any_deeply_nested_run_field_is_422_never_500(client: TestClient, field: str, value: str) -> None:
    """Every validation error used to echo its input, and walking ~900 levels overflowed the stack."""
    body = {"name": '"deep"', field: value}
    response = post_raw(client, "{" + ", ".join(f'"{k}": {v}' for k, v in body.items()) + "}")
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == f"body.{field}"
    assert client.get(RUNS).json() == []


def test_config_problems_are_invalid_input_for_every_caller(client: TestClient, app: FastAPI) -> None:
    """Not only the API: the import command and the dashboard register runs through the service too."""
    from monitor.domain import Principal
    from monitor.errors import InvalidInput

    with pytest.raises(InvalidInput) as info:
        app.state.lldmon.runs.register(Principal(), "svc", None, json.loads(nested(40)), [])
    assert info.value.field == "config"
    assert client.get(RUNS).json() == []


def test_config_at_the_depth_limit_is_stored_whole(client: TestClient) -> None:
    response = post_raw(client, f'{{"name": "ok", "config": {nested(MAX_CONFIG_DEPTH)}}}')
    assert response.status_code == 201, response.text
    assert response.json()["config"] == json.loads(nested(MAX_CONFIG_DEPTH))


def test_config_over_the_size_limit_is_422_naming_config(client: TestClient, settings) -> None:  # type: ignore[no-untyped-def]
    big = {"blob": "x" * (MAX_CONFIG_BYTES + 1)}
    from monitor.api.app import create_app

    app = create_app(settings.model_copy(update={"max_body_bytes": 4 * MAX_CONFIG_BYTES}))
    with TestClient(app) as big_client:
        response = big_client.post(RUNS, json={"name": "big", "config": big})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == "body.config"
        assert str(MAX_CONFIG_BYTES) in response.json()["error"]["message"]
        assert big_client.get(RUNS).json() == []
    app.state.lldmon.db.dispose()


@pytest.mark.parametrize("depth", [500, 900])
def test_listing_survives_an_over_deep_config_stored_before_the_check(
    client: TestClient, app: FastAPI, depth: int
) -> None:
    bad = new_run(client, "stored-deep", project="p")
    good = new_run(client, "fine", project="p", config={"lr": 1e-6})
    store_config(app, bad, nested(depth))
    for params in ({"project": "p"}, {}):
        listing = client.get(RUNS, params=params)
        assert listing.status_code == 200, listing.text
        assert {r["id"] for r in listing.json()} == {bad, good}
    shown = client.get(f"{RUNS}/{bad}").json()["config"]
    # The first MAX_CONFIG_DEPTH levels are shown, what lies below is replaced by a marker.
    level = shown
    for _ in range(MAX_CONFIG_DEPTH - 1):
        level = level["a"]
    assert level == {"a": TOO_DEEP}
    assert client.get(f"{RUNS}/{good}").json()["config"] == {"lr": 1e-6}


def test_listing_survives_a_stored_config_json_cannot_parse(client: TestClient, app: FastAPI) -> None:
    """Deeper than Python's json can read at all: the run is listed with a note instead of its config."""
    run_id = new_run(client, "unreadable")
    store_config(app, run_id, nested(5000))
    listing = client.get(RUNS)
    assert listing.status_code == 200, listing.text
    assert listing.json()[0]["config"] == UNREADABLE


def test_runs_show_json_survives_an_over_deep_config(client: TestClient, app: FastAPI, db_url: str) -> None:
    run_id = new_run(client, "cli-deep")
    store_config(app, run_id, nested(900))
    result = CliRunner().invoke(cli_app, ["runs", "show", str(run_id), "--json", "--database-url", db_url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["name"] == "cli-deep"


# --- 9: non-finite config values ----------------------------------------------------------------------

NONFINITE_CONFIG = (
    '{"max_grad_norm": Infinity, "floor": -Infinity, "target": NaN, "betas": [0.9, NaN], "s": "x"}'
)
NONFINITE_STORED = {
    "max_grad_norm": "Infinity",
    "floor": "-Infinity",
    "target": "NaN",
    "betas": [0.9, "NaN"],
    "s": "x",
}


def test_nonfinite_config_values_are_stored_as_the_wire_strings(client: TestClient, app: FastAPI) -> None:
    """One behaviour on both databases (PostgreSQL answered 500, SQLite stored null): the strings the
    wire uses for non-finite metric values, in the response, on reads and in the database."""
    response = post_raw(client, f'{{"name": "nf", "config": {NONFINITE_CONFIG}}}')
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    assert response.json()["config"] == NONFINITE_STORED
    assert client.get(f"{RUNS}/{run_id}").json()["config"] == NONFINITE_STORED
    assert client.get(RUNS).json()[0]["config"] == NONFINITE_STORED
    with app.state.lldmon.db.read() as conn:
        assert conn.execute(select(Run.config).where(Run.id == run_id)).scalar_one() == NONFINITE_STORED
    again = post_raw(client, f'{{"name": "nf", "config": {NONFINITE_CONFIG}}}')  # re-registration
    assert again.status_code == 200 and again.json()["config"] == NONFINITE_STORED


def test_nonfinite_tokens_stored_before_the_fix_read_as_the_wire_strings(
    client: TestClient, app: FastAPI, backend: str
) -> None:
    if backend != "sqlite":
        pytest.skip("only SQLite could store the NaN / Infinity tokens")
    run_id = new_run(client, "old-nf")
    store_config(app, run_id, NONFINITE_CONFIG)
    assert client.get(f"{RUNS}/{run_id}").json()["config"] == NONFINITE_STORED


# --- 10: the batch ledger -----------------------------------------------------------------------------


def test_an_actions_batch_may_reuse_a_metrics_batch_id(client: TestClient) -> None:
    run_id = new_run(client)
    metrics = client.post(f"{RUNS}/{run_id}/metrics", json=metrics_batch([3], {"loss": [0.5]}, "shared-id"))
    actions = client.post(f"{RUNS}/{run_id}/actions", json=action_batch(2, step=3, batch_id="shared-id"))
    assert metrics.json()["duplicate"] is False
    assert actions.status_code == 200 and actions.json()["duplicate"] is False
    assert actions.json()["rows"] == 2
    stored = client.get(f"{RUNS}/{run_id}/actions").json()
    assert stored["traj_index"] == [0, 1]


@pytest.mark.parametrize("kind", ["metrics", "actions"])
def test_same_batch_id_with_another_payload_is_409_naming_it(client: TestClient, kind: str) -> None:
    run_id = new_run(client)
    if kind == "metrics":
        first = metrics_batch([5], {"loss": [0.5]}, batch_id="b-7")
        other = {**first, "metrics": {"loss": [9.0]}}
    else:
        first = action_batch(2, step=5, batch_id="b-7")
        other = {**first, "delta": [-5.0, -6.0]}
    assert client.post(f"{RUNS}/{run_id}/{kind}", json=first).status_code == 200
    same = client.post(f"{RUNS}/{run_id}/{kind}", json=first)
    assert same.status_code == 200 and same.json()["duplicate"] is True
    response = client.post(f"{RUNS}/{run_id}/{kind}", json=other)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["field"] == "batch_id" and "'b-7'" in error["message"]
    if kind == "metrics":
        assert history(client, run_id)["loss"] == {"steps": [5], "values": [0.5]}
    else:
        assert client.get(f"{RUNS}/{run_id}/actions").json()["delta"] == first["delta"]
    assert (
        f'lldmon_ingest_batches_total{{kind="{kind}",outcome="rejected"}} 1.0' in client.get("/metrics").text
    )


def test_same_payload_spelled_with_tokens_or_strings_is_a_duplicate(client: TestClient) -> None:
    run_id = new_run(client)
    as_strings = metrics_batch([1, 2], {"grad/norm": ["NaN", "Infinity"]}, batch_id="nf")
    assert client.post(f"{RUNS}/{run_id}/metrics", json=as_strings).json()["duplicate"] is False
    as_tokens = '{"batch_id": "nf", "steps": [1, 2], "metrics": {"grad/norm": [NaN, Infinity]}}'
    response = client.post(
        f"{RUNS}/{run_id}/metrics", content=as_tokens, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200 and response.json()["duplicate"] is True
    minus = metrics_batch([1, 2], {"grad/norm": ["NaN", "-Infinity"]}, batch_id="nf")
    assert client.post(f"{RUNS}/{run_id}/metrics", json=minus).status_code == 409


# --- 5: detector work per request ---------------------------------------------------------------------


def _judged_up_to(app: FastAPI, run_id: int) -> int | None:
    with app.state.lldmon.db.read() as conn:
        state = conn.execute(select(Run.detector_state).where(Run.id == run_id)).scalar_one()
    return None if state is None else state["last_step"]


def _scenario_batch(lo: int, hi: int) -> dict[str, Any]:
    scenario = collapse_scenario(3)
    return {
        "batch_id": uuid.uuid4().hex,
        "steps": [int(s) for s in scenario.steps[lo:hi]],
        "metrics": {
            name: [
                encode_float(float(v)) if p else None
                for v, p in zip(values[lo:hi], scenario.present[name][lo:hi], strict=True)
            ]
            for name, values in scenario.values.items()
        },
    }


def test_a_huge_batch_is_judged_a_bounded_window_per_request_then_caught_up(
    client: TestClient, app: FastAPI
) -> None:
    """One request judges at most `max_points` steps, `chunk_points` per transaction; the following
    batches catch up, and phases and directive are those of judging everything at once."""
    n = len(collapse_scenario(3).steps)
    reference = new_run(client, "at-once")
    bounded = new_run(client, "bounded")
    for run_id in (reference, bounded):
        client.put(f"{RUNS}/{run_id}/policy", json={"policy": "auto"})
    client.post(f"{RUNS}/{reference}/metrics", json=_scenario_batch(0, n)).raise_for_status()
    assert _judged_up_to(app, reference) == n - 1

    detection = app.state.lldmon.detection
    detection.max_points, detection.chunk_points = 50, 16
    transactions: list[int] = []
    write = app.state.lldmon.db.write

    def counting_write():  # type: ignore[no-untyped-def]
        transactions.append(1)
        return write()

    app.state.lldmon.db.write = counting_write
    try:
        client.post(f"{RUNS}/{bounded}/metrics", json=_scenario_batch(0, n - 4)).raise_for_status()
    finally:
        del app.state.lldmon.db.write
    assert _judged_up_to(app, bounded) == 49
    assert len(transactions) == 1 + 4  # the batch, then chunks of 16, 16, 16 and 2 steps
    for i in range(n - 4, n):  # the run goes on one step per batch; the backlog is judged meanwhile
        client.post(f"{RUNS}/{bounded}/metrics", json=_scenario_batch(i, i + 1)).raise_for_status()
    assert _judged_up_to(app, bounded) == n - 1

    def phases(run_id: int) -> list[tuple[int, str]]:
        return [(e["step"], e["phase"]) for e in client.get(f"{RUNS}/{run_id}/events").json()]

    assert ("collapse" in {p for _, p in phases(reference)}) and phases(bounded) == phases(reference)
    # The directive is decided once per chunk, as once per batch online (so lambda may have escalated).
    for run_id in (reference, bounded):
        assert client.get(f"{RUNS}/{run_id}/directive").json()["llds"]["enabled"] is True


def test_a_huge_last_batch_is_judged_in_full_when_the_run_finishes(client: TestClient, app: FastAPI) -> None:
    """A batch over the per-request bound with no batch after it: finishing the run judges the rest,
    so its phases are those of judging everything at once."""
    n = len(collapse_scenario(3).steps)
    reference = new_run(client, "whole")
    client.post(f"{RUNS}/{reference}/metrics", json=_scenario_batch(0, n)).raise_for_status()
    detection = app.state.lldmon.detection
    detection.max_points, detection.chunk_points = 50, 16
    last = new_run(client, "last-batch")
    client.post(f"{RUNS}/{last}/metrics", json=_scenario_batch(0, n)).raise_for_status()
    assert _judged_up_to(app, last) == 49
    client.post(f"{RUNS}/{last}/finish", json={"status": "finished"}).raise_for_status()
    assert _judged_up_to(app, last) == n - 1
    events = [
        [(e["step"], e["phase"]) for e in client.get(f"{RUNS}/{r}/events").json()] for r in (reference, last)
    ]
    assert events[0] == events[1] and "collapse" in {p for _, p in events[0]}


def test_a_huge_batch_does_not_hold_up_another_runs_ingest(client: TestClient, app: FastAPI) -> None:
    """While the detector works through a huge batch of one run, another run's batch is stored and
    acknowledged: it waits at most for one chunk, not for the whole batch (on SQLite every write
    shares one lock). Measured as an order and a ratio of durations, not in seconds."""
    n = 8000
    app.state.lldmon.detection.max_points = n  # all judged in this request: what is tested is the lock
    huge = new_run(client, "huge")
    other = new_run(client, "other")
    client.post(f"{RUNS}/{other}/metrics", json=metrics_batch([0], {M.REWARD_MEAN: [0.5]})).raise_for_status()
    finished: dict[str, float] = {}

    def send_huge() -> None:
        body = metrics_batch(list(range(n)), {M.REWARD_MEAN: [0.5 + 1e-5 * i for i in range(n)]})
        response = client.post(f"{RUNS}/{huge}/metrics", json=body)
        finished["huge"] = time.perf_counter()
        finished["status"] = response.status_code

    sender = threading.Thread(target=send_huge)
    sender.start()
    while client.get(f"{RUNS}/{huge}").json()["last_step"] != n - 1:  # stored; the detector is at work
        assert sender.is_alive()
        time.sleep(0.005)
    committed = time.perf_counter()
    response = client.post(f"{RUNS}/{other}/metrics", json=metrics_batch([1], {M.REWARD_MEAN: [0.6]}))
    other_done = time.perf_counter()
    sender.join()
    assert response.status_code == 200 and finished["status"] == 200
    assert _judged_up_to(app, huge) == n - 1 and _judged_up_to(app, other) == 1
    assert other_done < finished["huge"]
    assert other_done - committed < 0.5 * (finished["huge"] - committed)
