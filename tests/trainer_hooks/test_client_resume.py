"""A client in a job that `lldmon supervise` restarted for a rollback starts with the directive the
service holds for its run (against a live `lldmon serve`), so the first step trained again runs with
it; when the service does not answer, the constructor waits a bounded time, warns once and goes on
with the default. And such a job's client leaves the run running at exit."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from contracts.directive import LLDSDirective
from tests.live_server import LiveServer, blackhole, free_port
from trainer_hooks import rollback
from trainer_hooks.client import MonitorClient

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("server")).start() as live:
        yield live


@pytest.fixture
def restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment `lldmon supervise` gives a job it restarted for a rollback."""
    monkeypatch.setenv(rollback.ENV_RESUME_FROM, "/ckpt/checkpoint-4")
    monkeypatch.setenv(rollback.ENV_ROLLED_BACK_TO, "4")
    monkeypatch.setenv(rollback.ENV_LR_SCALE, "0.5")
    monkeypatch.setenv(rollback.ENV_ROLLBACK_VERSION, "2")


def healed_run(server: LiveServer, name: str) -> int:
    """A run whose directive has LLDS on (lambda 0.3) and a rollback request, as policy `heal` leaves it."""
    reply = httpx.post(f"{server.api}/runs", json={"name": name}, timeout=10)
    reply.raise_for_status()
    run_id = int(reply.json()["id"])
    body = {
        "llds": {"enabled": True, "lam": 0.3},
        "rollback": {"to_step": 4, "lr_scale": 0.5},
        "reason": "heal",
    }
    httpx.put(f"{server.api}/runs/{run_id}/directive", json=body, timeout=10).raise_for_status()
    return run_id


@pytest.mark.usefixtures("restarted")
def test_a_restarted_job_has_the_runs_directive_before_its_first_log(
    server: LiveServer, make_client: Callable[..., MonitorClient]
) -> None:
    run_id = healed_run(server, "healed")
    # a flush interval far beyond the test: nothing but the start-up fetch can bring the directive
    client = make_client(server.url, "healed", flush_interval=3600)
    directive = client.directive
    assert directive.llds == LLDSDirective(enabled=True, lam=0.3)
    assert directive.rollback == directive.version > 0 and directive.rollback_to == 4
    assert client.run_id == run_id  # it attached to the existing run
    assert client.stats.records == 0  # before anything was logged


def test_a_new_job_does_not_wait_for_the_directive(make_client: Callable[..., MonitorClient]) -> None:
    with blackhole() as url:
        started = time.monotonic()
        client = make_client(url, "fresh", timeout=2.0)
        assert time.monotonic() - started < 1.0  # a restarted job's client would wait 2 s here
        assert client.directive.version == 0
        client.close(timeout=5)  # the request in flight ends within its 2 s


@pytest.mark.usefixtures("restarted")
def test_a_silent_service_costs_a_bounded_wait_and_one_warning(
    make_client: Callable[..., MonitorClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lldmon.client")
    with blackhole() as url:
        started = time.monotonic()
        client = make_client(url, "silent", timeout=2.0, directive_wait=0.5)
        waited = time.monotonic() - started
        assert 0.5 <= waited < 2.0  # the wait asked for, not the request timeout
        assert client.directive.llds == LLDSDirective()  # the default: LLDS off
        client.log(1, {"a": 1.0})  # training goes on
        client.close(timeout=5)
    warnings = [r.getMessage() for r in caplog.records if "no directive" in r.getMessage()]
    assert len(warnings) == 1 and "'silent'" in warnings[0], warnings


@pytest.mark.usefixtures("restarted")
def test_an_unreachable_service_ends_the_wait_at_once(
    make_client: Callable[..., MonitorClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lldmon.client")
    started = time.monotonic()
    client = make_client(f"http://127.0.0.1:{free_port()}", "refused", directive_wait=30.0)
    assert time.monotonic() - started < 10.0  # the refusal ends the wait, not the 30 s
    assert client.directive.version == 0
    assert any("no directive" in r.getMessage() for r in caplog.records)


def test_a_job_that_handed_over_a_rollback_leaves_its_run_running_at_exit(
    server: LiveServer, tmp_path: Path
) -> None:
    code = (
        "import os, sys\n"
        "from trainer_hooks import rollback\n"
        "from trainer_hooks.client import MonitorClient\n"
        f"client = MonitorClient({server.url!r}, sys.argv[1], spool_dir={str(tmp_path / 'spool')!r})\n"
        "client.log(1, {'a': 1.0})\n"
        "if sys.argv[2] == 'rollback':\n"
        "    rollback.write_request(os.environ[rollback.ENV_REQUEST], rollback.RollbackRequest('c', 0, 1.0, 1))\n"
    )
    for name, how in (("handed-over", "rollback"), ("done", "normal")):
        env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", rollback.ENV_REQUEST: str(tmp_path / name)}
        subprocess.run([sys.executable, "-c", code, name, how], check=True, cwd=ROOT, env=env, timeout=60)
    status = {r["name"]: r["status"] for r in server.get("/runs")}
    assert status["handed-over"] == "running" and status["done"] == "finished"
