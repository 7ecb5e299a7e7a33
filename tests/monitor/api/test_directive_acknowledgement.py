"""Directive acknowledgements are capped at versions that exist, on SQLite and PostgreSQL, against a real
`lldmon serve`: a `directive/applied_version` above the run's current version when its batch arrives
(a buggy trainer), or one that is no version at all (NaN, +-inf, a fraction, 0, negative), acknowledges
nothing, so a later checkpoint or stop request stays pending until a batch carries its real version; an
import of another run's export (local and `--url`) keeps the values as metrics and acknowledges none
of this run's requests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from contracts.directive import APPLIED_VERSION_METRIC, LeverTracker
from monitor.cli import app
from tests.conftest import live_server_on
from tests.live_server import LiveServer

pytestmark = pytest.mark.timeout(180)
runner = CliRunner()


@pytest.fixture(scope="module")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server_on(backend, tmp_path_factory.mktemp(f"acks-{backend}")) as live:
        yield live


def new_run(server: LiveServer, name: str, project: str = "acks") -> int:
    reply = httpx.post(f"{server.api}/runs", json={"name": name, "project": project}, timeout=10)
    reply.raise_for_status()
    return int(reply.json()["id"])


def send(server: LiveServer, run_id: int, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    body = {"batch_id": uuid.uuid4().hex, "steps": [step], "metrics": {k: [v] for k, v in metrics.items()}}
    reply = httpx.post(f"{server.api}/runs/{run_id}/metrics", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def request(server: LiveServer, run_id: int, body: dict[str, Any]) -> dict[str, Any]:
    reply = httpx.put(f"{server.api}/runs/{run_id}/directive", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def applied(server: LiveServer, run_id: int) -> tuple[int, list[int | None]]:
    """(GET /directive's applied_version, GET /directives' applied_step per version)."""
    history = server.get(f"/runs/{run_id}/directives")
    return server.get(f"/runs/{run_id}/directive")["applied_version"], [d["applied_step"] for d in history]


def test_an_acknowledgement_from_the_future_acknowledges_nothing(server: LiveServer) -> None:
    run_id = new_run(server, f"future-{uuid.uuid4().hex[:6]}")
    send(server, run_id, 1, {APPLIED_VERSION_METRIC: 1000.0, "reward/mean": 0.5})
    assert applied(server, run_id) == (0, [])

    checkpoint = request(server, run_id, {"checkpoint": True, "reason": "before the eval"})
    assert checkpoint["version"] == checkpoint["checkpoint"] == 1
    assert checkpoint["applied_version"] == 0
    assert LeverTracker().take(server.get(f"/runs/{run_id}/directive")).checkpoint  # a trainer acts on it

    ack = send(server, run_id, 2, {APPLIED_VERSION_METRIC: 1000.0})  # still above every version: ignored
    assert ack["directive"]["applied_version"] == 0
    assert applied(server, run_id) == (0, [None])

    stop = request(server, run_id, {"stop": True, "reason": "out of budget"})
    assert stop["version"] == stop["stop"] == 2 and stop["applied_version"] == 0
    levers = LeverTracker().take(server.get(f"/runs/{run_id}/directive"))  # a restarted trainer
    assert levers.checkpoint and levers.stop and levers.acknowledge == 2

    send(server, run_id, 3, {APPLIED_VERSION_METRIC: 1.0})  # the checkpoint's real version
    assert applied(server, run_id) == (1, [3, None])
    levers = LeverTracker().take(server.get(f"/runs/{run_id}/directive"))
    assert not levers.checkpoint and levers.stop

    send(server, run_id, 4, {APPLIED_VERSION_METRIC: 2.0})
    assert applied(server, run_id) == (2, [3, 4])
    assert LeverTracker().take(server.get(f"/runs/{run_id}/directive")) == type(levers)()
    # the values stay stored as the trainer logged them
    series = server.get(f"/runs/{run_id}/metrics", names=[APPLIED_VERSION_METRIC])["series"]
    assert series[APPLIED_VERSION_METRIC] == {"steps": [1, 2, 3, 4], "values": [1000.0, 1000.0, 1.0, 2.0]}


def test_values_that_are_no_version_acknowledge_nothing(server: LiveServer) -> None:
    run_id = new_run(server, f"novalue-{uuid.uuid4().hex[:6]}")
    request(server, run_id, {"checkpoint": True})
    request(server, run_id, {"stop": True})
    for step, value in enumerate(["NaN", "Infinity", "-Infinity", -1.0, -2.0, 0.0, 0.5, 1.5, 3.0, 1e300]):
        send(server, run_id, step, {APPLIED_VERSION_METRIC: value})
        assert applied(server, run_id) == (0, [None, None]), value
    send(server, run_id, 20, {APPLIED_VERSION_METRIC: 2})
    assert applied(server, run_id) == (2, [20, 20])
    # a later, lower or repeated acknowledgement moves nothing back
    send(server, run_id, 21, {APPLIED_VERSION_METRIC: 1})
    assert applied(server, run_id) == (2, [20, 20])


def test_one_batch_acknowledges_in_step_order(server: LiveServer) -> None:
    run_id = new_run(server, f"order-{uuid.uuid4().hex[:6]}")
    for _ in range(3):
        request(server, run_id, {"checkpoint": True})
    body = {
        "batch_id": uuid.uuid4().hex,
        "steps": [7, 5, 6, 8],
        "metrics": {APPLIED_VERSION_METRIC: [2.0, 1.0, 9.0, None]},
    }
    httpx.post(f"{server.api}/runs/{run_id}/metrics", json=body, timeout=30).raise_for_status()
    assert applied(server, run_id) == (2, [5, 7, None])


def lldmon(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


@pytest.mark.parametrize("remote", [False, True], ids=["local", "url"])
def test_an_import_of_another_runs_export_acknowledges_nothing(
    server: LiveServer, tmp_path: Path, remote: bool
) -> None:
    tag = uuid.uuid4().hex[:6]
    other = new_run(server, f"other-{tag}")
    for step in range(1, 6):  # another run whose trainer acknowledged its own versions 1..5
        request(server, other, {"checkpoint": True})
        send(server, other, step, {APPLIED_VERSION_METRIC: float(step), "reward/mean": 0.1 * step})
    assert applied(server, other)[0] == 5
    exported = tmp_path / "other.csv"
    code, output = lldmon("export", str(other), "--url", server.url, "--output", str(exported))
    assert code == 0, output

    run_id = new_run(server, f"target-{tag}")
    send(server, run_id, 0, {"reward/mean": 0.0})
    request(server, run_id, {"checkpoint": True})
    request(server, run_id, {"stop": True, "reason": "budget"})
    where = (
        ["--url", server.url]
        if remote
        else (
            ["--database-url", server.database_url]
            if server.database_url
            else ["--data-dir", str(server.data_dir)]
        )
    )
    code, output = lldmon(
        "import", str(exported), "--run", f"target-{tag}", "--project", "acks", "--append", *where
    )
    assert code == 0, output
    series = server.get(f"/runs/{run_id}/metrics", names=[APPLIED_VERSION_METRIC])["series"]
    assert series[APPLIED_VERSION_METRIC]["values"] == [1.0, 2.0, 3.0, 4.0, 5.0]  # imported as data
    assert applied(server, run_id) == (0, [None, None])
    levers = LeverTracker().take(server.get(f"/runs/{run_id}/directive"))
    assert levers.checkpoint and levers.stop
