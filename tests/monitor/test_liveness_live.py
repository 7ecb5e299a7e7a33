"""A real training client killed with SIGKILL shows up as `stalled`, then `crashed`, with a run_stalled
alert, against a real `lldmon serve` (SQLite and PostgreSQL); a new batch revives it. A client that is
alive but between steps keeps its run `running` with heartbeats."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.wire import ALERT_RUN_STALLED
from tests.conftest import live_server_on
from tests.live_server import LiveServer

pytestmark = pytest.mark.timeout(180)

TRAINER = textwrap.dedent(
    """
    import sys, time
    from trainer_hooks.client import MonitorClient

    url, name, spool, beat, log_steps = sys.argv[1:6]
    client = MonitorClient(url, name, project="p", spool_dir=spool, flush_interval=0.1,
                           heartbeat_interval=float(beat), enabled=True)
    step = 0
    while True:
        if log_steps == "1":
            client.log(step, {"reward/mean": 0.5})
            step += 1
        time.sleep(0.05)
    """
)


@pytest.fixture(scope="module")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp(f"liveness-{backend}")
    with live_server_on(backend, tmp, {"LLDMON_LIVENESS_SWEEP_SECONDS": "0.2"}) as live:
        yield live


def _trainer(
    server: LiveServer, tmp_path: Path, name: str, beat: float, log_steps: bool
) -> subprocess.Popen[bytes]:
    args = [server.url, name, str(tmp_path / "spool" / name), str(beat), "1" if log_steps else "0"]
    return subprocess.Popen([sys.executable, "-c", TRAINER, *args], env={**os.environ})


def _wait_for(what: str, probe: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _run(server: LiveServer, name: str) -> dict[str, Any] | None:
    runs = httpx.get(f"{server.api}/runs", params={"name": name, "project": "p"}).json()
    return runs[0] if runs else None


def _status(server: LiveServer, run_id: int) -> str:
    return str(httpx.get(f"{server.api}/runs/{run_id}").json()["status"])


def _stalled_alerts(server: LiveServer, run_id: int) -> list[dict[str, Any]]:
    alerts = httpx.get(f"{server.api}/runs/{run_id}/alerts").json()
    return [a for a in alerts if a["kind"] == ALERT_RUN_STALLED]


def test_killed_trainer_is_stalled_then_crashed_and_a_new_batch_revives_it(
    server: LiveServer, tmp_path: Path
) -> None:
    proc = _trainer(server, tmp_path, "killed", beat=60, log_steps=True)
    try:
        run = _wait_for(
            "steps to arrive", lambda: (r := _run(server, "killed")) and (r["last_step"] or 0) >= 5 and r
        )
        run_id = int(run["id"])
        put = httpx.put(f"{server.api}/runs/{run_id}/liveness", json={"stall_after_s": 2, "crash_after_s": 4})
        assert put.status_code == 200
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed_at = time.monotonic()
    assert _status(server, run_id) == "running"

    _wait_for("stalled", lambda: _status(server, run_id) == "stalled", timeout=15)
    assert time.monotonic() - killed_at >= 1.5  # not before the threshold
    (alert,) = _stalled_alerts(server, run_id)
    assert alert["status"] == "open" and alert["severity"] == "warning"

    _wait_for("crashed", lambda: _status(server, run_id) == "crashed", timeout=15)
    (alert,) = _stalled_alerts(server, run_id)
    assert alert["status"] == "open" and alert["severity"] == "critical"

    body = {"batch_id": "after-restart", "steps": [10_000], "metrics": {"reward/mean": [0.5]}}
    assert httpx.post(f"{server.api}/runs/{run_id}/metrics", json=body).status_code == 200
    assert _status(server, run_id) == "running"
    _wait_for(
        "the alert to resolve",
        lambda: [a["status"] for a in _stalled_alerts(server, run_id)] == ["resolved"],
        timeout=10,
    )


def test_heartbeats_keep_a_run_between_steps_running(server: LiveServer, tmp_path: Path) -> None:
    proc = _trainer(server, tmp_path, "slow-step", beat=0.3, log_steps=False)
    try:
        run = _wait_for("registration", lambda: _run(server, "slow-step"))
        run_id = int(run["id"])
        httpx.put(f"{server.api}/runs/{run_id}/liveness", json={"stall_after_s": 1.5, "crash_after_s": 3})
        time.sleep(4)
        assert _status(server, run_id) == "running"
        assert _stalled_alerts(server, run_id) == []
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    _wait_for("stalled once the beats stop", lambda: _status(server, run_id) != "running", timeout=10)
