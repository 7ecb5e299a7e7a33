"""The directive's levers (issue 15) against a real `lldmon serve`, on SQLite and PostgreSQL: a manual
checkpoint / stop request reaches a real `MonitorClient`, is acted on once and acknowledged in the next
batch (GET /directive's applied_version, GET /directives' applied_step); a restarted trainer does not
repeat it; the `directive` CLI command; and the policy's own requests (`auto`: a checkpoint when decay
starts; stop-on-collapse: a stop when collapse starts)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from contracts.directive import APPLIED_VERSION_METRIC
from contracts.wire import encode_float
from lldmon_lab.scenarios import collapse_scenario
from monitor.cli import app
from tests.conftest import live_server_on
from tests.live_server import LiveServer
from trainer_hooks.client import Levers, MonitorClient

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server_on(backend, tmp_path_factory.mktemp(f"levers-{backend}")) as live:
        yield live


def put(server: LiveServer, run_id: int, body: dict[str, Any]) -> httpx.Response:
    return httpx.put(f"{server.api}/runs/{run_id}/directive", json=body, timeout=10)


def wait(what: str, probe: Callable[[], Any], client: MonitorClient | None = None, step: int = 0) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        if client is not None:  # the directive comes back with the next ingest acknowledgement
            client.log(step, {"test/heartbeat": 1.0})
            client.flush(5)
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def trainer(server: LiveServer, tmp_path: Path, name: str) -> MonitorClient:
    client = MonitorClient(server.url, name, spool_dir=tmp_path / uuid.uuid4().hex, flush_interval=0.05)
    client.log(0, {"test/heartbeat": 1.0})
    wait("registration", lambda: client.run_id, client)
    return client


def test_manual_requests_are_acted_on_once_and_acknowledged(server: LiveServer, tmp_path: Path) -> None:
    client = trainer(server, tmp_path, f"levers-{uuid.uuid4().hex[:6]}")
    run_id = client.run_id
    assert run_id is not None
    # bad bodies: a 422 naming what is wrong, nothing written
    empty = put(server, run_id, {"reason": "nothing"})
    assert empty.status_code == 422 and "nothing to change" in empty.text
    bad = put(server, run_id, {"stop": "soon"})
    assert bad.status_code == 422 and "stop" in str(bad.json())
    assert server.get(f"/runs/{run_id}/directive")["version"] == 0

    reply = put(server, run_id, {"checkpoint": True, "reason": "before the eval"})
    assert reply.status_code == 200, reply.text
    v1 = reply.json()
    assert v1["checkpoint"] == v1["version"] == 1 and v1["stop"] == 0 and v1["source"] == "manual"
    assert v1["llds"] == {"enabled": False, "lam": 0.2} and v1["applied_version"] == 0

    wait("the checkpoint request", lambda: client.directive.checkpoint == 1, client, step=1)
    assert client.take_levers(2) == Levers(checkpoint=True, acknowledge=1)
    assert client.take_levers(3) == Levers()  # once per request
    wait("the acknowledgement", lambda: server.get(f"/runs/{run_id}/directive")["applied_version"] == 1)
    (history,) = server.get(f"/runs/{run_id}/directives")
    assert history["applied_step"] == 2
    assert server.get(f"/runs/{run_id}/metrics", names=[APPLIED_VERSION_METRIC])["series"][
        APPLIED_VERSION_METRIC
    ] == {"steps": [2], "values": [1.0]}

    stop = put(server, run_id, {"stop": True, "reason": "out of budget"}).json()
    assert stop["stop"] == stop["version"] == 2 and stop["stop_reason"] == "out of budget"
    assert stop["checkpoint"] == 1  # carried forward: not a new request
    wait("the stop request", lambda: client.directive.stop == 2, client, step=4)
    assert client.take_levers(5) == Levers(stop=True, stop_reason="out of budget", acknowledge=2)
    client.close()
    wait(
        "the stop's acknowledgement", lambda: server.get(f"/runs/{run_id}/directive")["applied_version"] == 2
    )
    assert [d["applied_step"] for d in server.get(f"/runs/{run_id}/directives")] == [2, 5]

    # The job is resumed: the new process sees the stop in force but does not stop again.
    resumed = trainer(server, tmp_path, str(server.get(f"/runs/{run_id}")["name"]))
    wait("the directive", lambda: resumed.directive.version == 2, resumed, step=6)
    assert resumed.take_levers(6) == Levers()
    resumed.close()


def test_directive_cli_command(server: LiveServer, tmp_path: Path) -> None:
    client = trainer(server, tmp_path, f"cli-{uuid.uuid4().hex[:6]}")
    client.close()
    run = str(client.run_id)
    where = (
        ["--database-url", server.database_url]
        if server.database_url
        else ["--data-dir", str(server.data_dir)]
    )

    def cli(*args: str) -> Any:
        return CliRunner().invoke(app, ["directive", run, *args, *where], env={"COLUMNS": "200"})

    out = cli("--checkpoint", "--stop-on-collapse", "on", "--reason", "keep the weights")
    assert out.exit_code == 0, out.output
    assert "directive v1" in out.output and "checkpoint request #1" in out.output
    assert "stop on collapse" in out.output and "not acknowledged yet" in out.output
    out = cli("--stop")
    assert out.exit_code == 0 and "stop requested (#2: manual stop request)" in out.output, out.output
    out = cli("--withdraw-stop")
    assert out.exit_code == 0 and "stop requested" not in out.output, out.output
    d = server.get(f"/runs/{run}/directive")
    assert (d["version"], d["checkpoint"], d["stop"], d["stop_on_collapse"]) == (3, 1, 0, True)
    assert d["llds"]["enabled"] is False
    bad = cli("--stop-on-collapse", "maybe")
    assert bad.exit_code == 2 and "maybe" in bad.output and "Traceback" not in bad.output


def stream(server: LiveServer, run_id: int, seed: int) -> int:
    """A labelled collapse, sent as a trainer would (10 steps a batch); returns its collapse step."""
    scenario = collapse_scenario(seed)
    with httpx.Client(base_url=server.api, timeout=30) as http:
        for lo in range(0, len(scenario.steps), 10):
            sl = slice(lo, lo + 10)
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
            response = http.post(f"/runs/{run_id}/metrics", json=body)
            assert response.status_code == 200, response.text
    assert scenario.collapse_step is not None
    return scenario.collapse_step


def test_policy_requests_a_checkpoint_at_decay_and_opted_in_stop_at_collapse(server: LiveServer) -> None:
    run_id = httpx.post(f"{server.api}/runs", json={"name": f"auto-{uuid.uuid4().hex[:6]}"}).json()["id"]
    assert httpx.put(f"{server.api}/runs/{run_id}/policy", json={"policy": "auto"}).status_code == 200
    # A person's request (checkpoint, stop-on-collapse) does not take LLDS away from the policy.
    assert put(server, run_id, {"checkpoint": True, "stop_on_collapse": True}).status_code == 200
    stream(server, run_id, seed=3)
    events = {e["phase"]: e["step"] for e in server.get(f"/runs/{run_id}/events")}
    history = server.get(f"/runs/{run_id}/directives")
    detector = [d for d in history if d["source"] == "detector"]
    checkpoints = [d for d in detector if d["checkpoint"] == d["version"]]
    stops = [d for d in detector if d["stop"] == d["version"]]
    assert len(checkpoints) == 1 and checkpoints[0]["step"] >= events["decay"]
    assert "entered decay" in checkpoints[0]["reason"] and checkpoints[0]["llds"]["enabled"]
    assert len(stops) == 1 and stops[0]["step"] >= events["collapse"]
    assert "stop-on-collapse" in stops[0]["stop_reason"]
    current = server.get(f"/runs/{run_id}/directive")
    assert current["stop"] == stops[0]["version"] and current["llds"]["enabled"]


def test_without_opt_in_or_auto_nothing_is_requested(server: LiveServer) -> None:
    run_id = httpx.post(f"{server.api}/runs", json={"name": f"alert-{uuid.uuid4().hex[:6]}"}).json()["id"]
    assert httpx.put(f"{server.api}/runs/{run_id}/policy", json={"policy": "alert"}).status_code == 200
    stream(server, run_id, seed=3)
    assert {e["phase"] for e in server.get(f"/runs/{run_id}/events")} >= {"decay", "collapse"}
    assert server.get(f"/runs/{run_id}/directives") == []
