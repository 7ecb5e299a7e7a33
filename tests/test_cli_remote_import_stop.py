"""`lldmon import --url` that stops part way does not end a run it did not start: Ctrl-C in an --append
into a trainer's live run leaves it `running` (and says so), the trainer's next batch and heartbeat find
it alive, the liveness sweeper still watches it; a run the import created is marked `failed`. The service runs in-process on both databases (the CLI's
HTTP client's requests are handed to the test client); Ctrl-C is a real SIGINT to this process, sent
while a batch is on its way, which the import defers to the batch boundary."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from monitor.cli import app, remote_import
from monitor.cli.remote import RemoteState

RUNS = "/api/v1/runs"
ENV = {"COLUMNS": "300", "LLDMON_URL": "", "LLDMON_TOKEN": ""}


@pytest.fixture
def remote(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str]]:
    """`lldmon ARGS --url` against the in-process service."""

    def forward(request: httpx.Request) -> httpx.Response:
        answer = client.request(
            request.method, str(request.url), headers=request.headers, content=request.read()
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    def state(url: str, token: str | None) -> RemoteState:
        return RemoteState(url, token, transport=httpx.MockTransport(forward))

    monkeypatch.setattr(remote_import, "RemoteState", state)

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, [*args, "--url", "http://testserver"], env=ENV)
        return result.exit_code, result.output

    return run


@pytest.fixture
def ctrl_c_in_batch(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Callable[[int], None]:
    """`arm(n)`: SIGINT to this process while the n-th batch is being sent (signal handlers run in the
    main thread, where the CLI runs). The disposition is set here, as a terminal's Ctrl-C finds it: a
    test process started in the background (`cmd &`, a CI runner) inherits SIGINT ignored, and the
    import rightly leaves an ignored SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    send = remote_import._Sender.send
    calls = {"n": 0, "at": 0}

    def sending(self: Any, run_id: int, body: dict[str, Any]) -> None:
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            os.kill(os.getpid(), signal.SIGINT)
        send(self, run_id, body)

    monkeypatch.setattr(remote_import._Sender, "send", sending)
    return lambda n: calls.update(at=n)


def csv_log(path: Path, steps: range) -> Path:
    path.write_text("step,reward/mean\n" + "".join(f"{s},0.5\n" for s in steps))
    return path


def log_batch(client: TestClient, run_id: int, batch: str, steps: list[int]) -> None:
    body = {"batch_id": batch, "steps": steps, "metrics": {"reward/mean": [0.5] * len(steps)}}
    response = client.post(f"{RUNS}/{run_id}/metrics", json=body)
    assert response.status_code == 200, response.text


def status(client: TestClient, run_id: int) -> str:
    return str(client.get(f"{RUNS}/{run_id}").json()["status"])


def test_ctrl_c_in_an_append_into_a_live_run_leaves_it_running(
    client: TestClient,
    remote: Callable[..., tuple[int, str]],
    ctrl_c_in_batch: Callable[[int], None],
    tmp_path: Path,
) -> None:
    run_id = int(client.post(RUNS, json={"name": "live"}).json()["id"])
    log_batch(client, run_id, "trainer-1", [1000])
    client.put(f"{RUNS}/{run_id}/liveness", json={"stall_after_s": 60, "crash_after_s": 300})
    ctrl_c_in_batch(3)
    log = csv_log(tmp_path / "old.csv", range(100))
    code, out = remote(
        "import", str(log), "--run", "live", "--append", "--format", "csv", "--chunk-steps", "10"
    )

    assert code == 130, out
    assert "Traceback" not in out
    assert "interrupted after 3 batches" in out and "left running" in out and "--append" in out, out
    assert "marked failed" not in out, out
    assert status(client, run_id) == "running"
    log_batch(client, run_id, "trainer-2", [1001])
    assert client.post(f"{RUNS}/{run_id}/heartbeat").json()["status"] == "running"
    sweep = client.app.state.lldmon.liveness.sweep  # type: ignore[attr-defined]
    assert sweep(datetime.now(timezone.utc) + timedelta(seconds=61)) == [(run_id, "stalled")]


def test_ctrl_c_marks_a_run_the_import_created_failed(
    client: TestClient,
    remote: Callable[..., tuple[int, str]],
    ctrl_c_in_batch: Callable[[int], None],
    tmp_path: Path,
) -> None:
    ctrl_c_in_batch(2)
    log = csv_log(tmp_path / "old.csv", range(100))
    code, out = remote("import", str(log), "--run", "new", "--format", "csv", "--chunk-steps", "10")

    assert code == 130, out
    assert "interrupted after 2 batches" in out and "marked failed" in out, out
    [run] = [r for r in client.get(RUNS).json() if r["name"] == "new"]
    assert run["status"] == "failed"
    # the mark is the API's finish: a trainer that registers the run again restarts it
    assert client.post(RUNS, json={"name": "new"}).json()["status"] == "running"


def test_a_complete_append_into_a_stalled_run_leaves_it_live(
    client: TestClient, remote: Callable[..., tuple[int, str]], tmp_path: Path
) -> None:
    run_id = int(client.post(RUNS, json={"name": "quiet"}).json()["id"])
    log_batch(client, run_id, "trainer-1", [1000])
    client.put(f"{RUNS}/{run_id}/liveness", json={"stall_after_s": 60, "crash_after_s": 300})
    sweep = client.app.state.lldmon.liveness.sweep  # type: ignore[attr-defined]
    assert sweep(datetime.now(timezone.utc) + timedelta(seconds=61)) == [(run_id, "stalled")]
    log = csv_log(tmp_path / "old.csv", range(30))
    code, out = remote("import", str(log), "--run", "quiet", "--append", "--format", "csv")
    assert code == 0, out
    assert status(client, run_id) == "running"  # live (registered again), not finished by the import
