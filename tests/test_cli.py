"""The `lldmon` command: db, token, runs, and `serve` as a real process (the README's main job)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from monitor.cli import app
from monitor.db.engine import make_engine
from monitor.db.migrate import current_revision, head_revision

runner = CliRunner()


def test_db_upgrade_current_downgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sub' / 'cli.db'}"
    result = runner.invoke(app, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 0, result.output
    engine = make_engine(url)
    assert current_revision(engine) == head_revision()
    result = runner.invoke(app, ["db", "current", "--database-url", url])
    assert f"database: {head_revision()}" in result.output
    assert runner.invoke(app, ["db", "downgrade", "base", "--database-url", url]).exit_code == 0
    assert current_revision(engine) is None
    engine.dispose()


def test_token_create_list_revoke(tmp_path: Path) -> None:
    args = ["--data-dir", str(tmp_path)]
    created = runner.invoke(app, ["token", "create", "--project", "nq", "--name", "ci", *args])
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    assert token.startswith("lldm_") and len(token) > 40
    listed = runner.invoke(app, ["token", "list", *args])
    assert "nq" in listed.output and token not in listed.output
    assert runner.invoke(app, ["token", "revoke", "1", *args]).exit_code == 0
    missing = runner.invoke(app, ["token", "revoke", "1", *args])
    assert missing.exit_code == 1 and "no active token" in missing.output


def test_runs_list(tmp_path: Path) -> None:
    from monitor.api.app import build_state
    from monitor.config import Settings
    from monitor.domain import Principal

    state = build_state(Settings(data_dir=tmp_path))
    state.runs.register(Principal(), "grpo-3b", "nq", {}, ["grpo"])
    state.db.dispose()
    result = runner.invoke(app, ["runs", "list", "--data-dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "grpo-3b" in result.output and "running" in result.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_starts_on_embedded_sqlite_and_ingests(tmp_path: Path) -> None:
    exe = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")
    port = _free_port()
    env = {**os.environ, "LLDMON_DATA_DIR": str(tmp_path / "data")}
    env.pop("LLDMON_DATABASE_URL", None)
    proc = subprocess.Popen(
        [exe, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.2)
        run = httpx.post(f"{base}/api/v1/runs", json={"name": "smoke"}).json()
        ack = httpx.post(
            f"{base}/api/v1/runs/{run['id']}/metrics",
            content=b'{"batch_id":"b","steps":[0],"metrics":{"grad/norm":[Infinity]}}',
        ).json()
        assert ack["rows"] == 1
        got = httpx.get(f"{base}/api/v1/runs/{run['id']}/metrics").json()
        assert got["series"]["grad/norm"]["values"] == ["Infinity"]
        assert (tmp_path / "data" / "lldmon.db").exists()
    finally:
        proc.terminate()
        output = proc.communicate(timeout=20)[0]
    assert f"http://127.0.0.1:{port}" in output


def test_serve_refuses_outdated_postgres(tmp_path: Path) -> None:
    pg = os.environ.get("LLDMON_TEST_DATABASE_URL")
    if not pg:
        pytest.skip("needs LLDMON_TEST_DATABASE_URL")
    from tests.conftest import drop_postgres_database, fresh_postgres_database

    url = fresh_postgres_database(pg)
    try:
        result = runner.invoke(app, ["serve", "--database-url", url])
        assert result.exit_code == 2
        assert "lldmon db upgrade" in result.output
    finally:
        drop_postgres_database(url)


def test_eval_reports_targets() -> None:
    """The targets are printed; whether --check passes is the detector's business (tests/monitor/
    test_eval_targets.py checks the gate on hand-made results)."""
    from lldmon_lab.evaluation import TARGET_CONTROLS, TARGET_CRITICAL, TARGET_EARLY

    # generated runs alone have all three targets (collapses with and without hooks, controls)
    result = runner.invoke(
        app, ["eval", "--collapse", "2", "--controls", "1", "--no-lab", "--no-found"], env={"COLUMNS": "240"}
    )
    assert result.exit_code == 0, result.output
    for target in (TARGET_CRITICAL, TARGET_EARLY, TARGET_CONTROLS):
        assert target in result.output
    missing = runner.invoke(
        app, ["eval", "--collapse", "1", "--controls", "0", "--real-runs", "/nonexistent"]
    )
    assert missing.exit_code == 2
