"""`lldmon db prune --actions-older-than`, end to end on every backend, and `LLDMON_ACTIONS_RETENTION` in a
real `lldmon serve`."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import update
from typer.testing import CliRunner

from contracts.wire import API_PREFIX
from monitor.cli import app
from monitor.db.engine import make_engine
from monitor.db.models import ActionBlock
from monitor.store._sql import table_of
from tests.conftest import live_server_on
from tests.monitor.api.helpers import action_batch, new_run

runner = CliRunner()
BLOCKS = table_of(ActionBlock)
WIDE = {"COLUMNS": "200"}


def age(db_url: str, run_id: int, steps: list[int], days: int = 40) -> None:
    """Make these steps' blocks look last written `days` ago."""
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            update(BLOCKS)
            .where((BLOCKS.c.run_id == run_id) & BLOCKS.c.step.in_(steps))
            .values(updated_at=datetime.now(timezone.utc) - timedelta(days=days))
        )
    engine.dispose()


def prune(db_url: str, *args: str) -> Any:
    return runner.invoke(app, ["db", "prune", "--database-url", db_url, *args], env=WIDE)


def steps_with_records(client: TestClient | httpx.Client, base: str, run_id: int) -> list[int]:
    response = client.get(f"{base}/runs/{run_id}/actions")
    assert response.status_code == 200, response.text
    return sorted(set(response.json()["step"]))


def write(client: TestClient, db_url: str) -> tuple[int, int]:
    """Runs a (steps 0-2, steps 0-1 aged 40 days) and b (step 0, aged 40 days)."""
    a = new_run(client, "run-a")
    b = new_run(client, "run-b")
    for step in range(3):
        client.post(f"{API_PREFIX}/runs/{a}/actions", json=action_batch(4, step=step)).raise_for_status()
    client.post(f"{API_PREFIX}/runs/{b}/actions", json=action_batch(5, step=0)).raise_for_status()
    age(db_url, a, [0, 1])
    age(db_url, b, [0])
    return a, b


def test_prune_dry_run_then_one_run_then_all(client: TestClient, db_url: str) -> None:
    a, b = write(client, db_url)

    dry = prune(db_url, "--actions-older-than", "30d", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would prune 3 action blocks (13 records) older than 30d" in dry.output
    assert steps_with_records(client, API_PREFIX, a) == [0, 1, 2]  # a dry run writes nothing

    one = prune(db_url, "--actions-older-than", "30d", "--run", "run-b")
    assert one.exit_code == 0, one.output
    assert f"pruned 1 action blocks (5 records) older than 30d of run {b}" in one.output
    assert steps_with_records(client, API_PREFIX, b) == []
    assert steps_with_records(client, API_PREFIX, a) == [0, 1, 2]

    rest = prune(db_url, "--actions-older-than", "720h")
    assert rest.exit_code == 0, rest.output
    assert "pruned 2 action blocks (8 records) older than 720h" in rest.output
    assert steps_with_records(client, API_PREFIX, a) == [2]
    summary = client.get(f"{API_PREFIX}/runs/{a}/actions/summary").json()
    assert summary["steps"] == [0, 1, 2] and summary["pruned"] == [True, True, False]

    again = prune(db_url, "--actions-older-than", "30d")
    assert again.exit_code == 0 and "pruned 0 action blocks (0 records)" in again.output


def test_prune_refuses_bad_input(client: TestClient, db_url: str) -> None:
    write(client, db_url)
    for bad in ("30", "30 days", "0d", "1.5h", "-2d"):
        result = prune(db_url, "--actions-older-than", bad)
        assert result.exit_code == 2, (bad, result.output)
        assert "--actions-older-than" in result.output and repr(bad) in result.output, result.output
    missing = runner.invoke(app, ["db", "prune", "--database-url", db_url], env=WIDE)
    assert missing.exit_code == 2 and "--actions-older-than" in missing.output
    unknown = prune(db_url, "--actions-older-than", "30d", "--run", "nope")
    assert unknown.exit_code == 1 and "no run is named 'nope'" in unknown.output
    absent = prune(db_url, "--actions-older-than", "30d", "--run", "999999")
    assert absent.exit_code == 1 and "run 999999 does not exist" in absent.output
    after = prune(db_url, "--actions-older-than", "30d", "--dry-run")
    assert "would prune 3 action blocks (13 records)" in after.output  # the refused commands pruned nothing


def test_serve_prunes_with_the_setting(backend: str, tmp_path: Path) -> None:
    env = {"LLDMON_ACTIONS_RETENTION": "30d", "LLDMON_ACTIONS_PRUNE_SECONDS": "0.2"}
    with live_server_on(backend, tmp_path, env=env) as live, httpx.Client(timeout=10) as http:
        db_url = live.database_url or f"sqlite:///{live.data_dir / 'lldmon.db'}"
        run_id = http.post(f"{live.api}/runs", json={"name": "old"}).json()["id"]
        for step in range(2):
            http.post(f"{live.api}/runs/{run_id}/actions", json=action_batch(3, step=step)).raise_for_status()
        age(db_url, run_id, [0])
        deadline = time.monotonic() + 20
        while steps_with_records(http, live.api, run_id) != [1]:
            assert time.monotonic() < deadline, "the server did not prune"
            time.sleep(0.1)
        summary = http.get(f"{live.api}/runs/{run_id}/actions/summary").json()
        assert summary["pruned"] == [True, False]
