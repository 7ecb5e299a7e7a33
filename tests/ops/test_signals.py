"""`lldmon serve` and `lldmon demo` stop cleanly on SIGTERM (docker stop, systemd, Kubernetes) and SIGINT
(Ctrl-C), whatever disposition the parent process left them in: each child here is started with the
disposition set explicitly (default, or ignored as for a job started in the background)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import drop_postgres_database, new_database
from tests.live_server import free_port

SIGNALS = [signal.SIGINT, signal.SIGTERM]
DISPOSITIONS = {"default": signal.SIG_DFL, "ignored": signal.SIG_IGN}


def _lldmon() -> str:
    return shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")


def _with_disposition(handler: signal.Handlers) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    return preexec


def _port_released(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LLDMON_DATABASE_URL", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


@pytest.mark.parametrize("disposition", list(DISPOSITIONS))
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_serve_stops_cleanly(backend: str, tmp_path: Path, sig: signal.Signals, disposition: str) -> None:
    """Exit status 0 and the port released. With SIGTERM's default disposition uvicorn re-raised the
    signal after its shutdown and the process died of it (status -15, a failure to docker and
    systemd); SIGINT ended in 130. On PostgreSQL with `--workers 2` (the supervisor and its workers)."""
    from monitor.db.migrate import upgrade

    port = free_port()
    args = [_lldmon(), "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)]
    database_url = None
    if backend == "postgres":
        database_url = new_database(backend, tmp_path)
        upgrade(database_url)
        args += ["--database-url", database_url, "--workers", "2"]
    log = tmp_path / "serve.log"
    try:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env(),
                preexec_fn=_with_disposition(DISPOSITIONS[disposition]),
            )
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            proc.send_signal(sig)
            code = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert code == 0, log.read_text()[-3000:]
        assert _port_released(port)
    finally:
        if database_url is not None:
            drop_postgres_database(database_url)


@pytest.mark.parametrize("disposition", list(DISPOSITIONS))
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_demo_stops_cleanly(tmp_path: Path, sig: signal.Signals, disposition: str) -> None:
    """`--keep-serving` after the replayed run: the demo stops its service (port released) and exits 0,
    the run stays finished. SIGTERM killed the demo alone and left its server holding the port; an
    ignored SIGINT was not seen at all."""
    port = free_port()
    data_dir = tmp_path / "data"
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                _lldmon(),
                "demo",
                "--no-train",
                "--keep-serving",
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_env(),
            preexec_fn=_with_disposition(DISPOSITIONS[disposition]),
        )
    try:
        deadline = time.monotonic() + 120
        while "until Ctrl-C" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert "stopping" in output
    assert _port_released(port), output[-3000:]
    db = sqlite3.connect(f"file:{data_dir / 'lldmon.db'}?mode=ro", uri=True)
    try:
        statuses = [row[0] for row in db.execute("SELECT status FROM runs")]
    finally:
        db.close()
    assert statuses == ["finished"]


def test_a_stopped_replay_marks_its_run_failed(tmp_path: Path) -> None:
    """Stopping the demo mid-replay used to leave the replayed run `running` in the service for ever."""
    from lldmon_lab.demo import Replay
    from tests.live_server import LiveServer

    with LiveServer(tmp_path / "data").start() as live:
        replay = Replay(live.api, "replay", seed=7, speed=20.0, batch=5)
        replay.start()
        deadline = time.monotonic() + 30
        while replay.steps_sent == 0:
            assert time.monotonic() < deadline and replay.error is None, replay.error
            time.sleep(0.05)
        replay.stop()
        assert replay.done.is_set() and replay.error is None
        run = live.get(f"/runs/{replay.run_id}")
        assert run["status"] == "failed"
        assert 0 < replay.steps_sent < replay.steps_total
