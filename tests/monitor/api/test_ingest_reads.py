"""What an ingest request asks of the database: its run is read once (the access check and the activity
update share the read), and a status change between that read and the update is not overwritten."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Connection, event

from contracts.wire import API_PREFIX, RUN_STALLED
from monitor.domain import DirectiveInfo
from monitor.store import ingest as ingest_store
from monitor.store import runs as run_store
from tests.monitor.api.helpers import action_batch, metrics_batch, new_run

BODIES = {"metrics": metrics_batch([3, 4], {"loss": [0.5, 0.4]}), "actions": action_batch(8, step=3)}


@pytest.fixture
def statements(app: FastAPI) -> Iterator[list[str]]:
    """The SQL the app's engine runs from here on."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    engine = app.state.lldmon.db.engine
    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


@pytest.mark.parametrize("kind", ["metrics", "actions"])
def test_a_batch_reads_and_updates_its_run_once(
    client: TestClient, app: FastAPI, statements: list[str], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    run_id = new_run(client)
    # The detector pass after a metrics batch reads the run for its own reasons: not this request's ingest.
    monkeypatch.setattr(app.state.lldmon.detection, "process", lambda *_a, **_k: DirectiveInfo())
    statements.clear()
    response = client.post(f"{API_PREFIX}/runs/{run_id}/{kind}", json=BODIES[kind])
    assert response.status_code == 200, response.text
    reads = [s for s in statements if re.search(r"\bFROM runs\b", s)]
    updates = [s for s in statements if re.match(r"\s*UPDATE runs\b", s)]
    assert len(reads) == 1 and len(updates) == 1, statements


def test_a_run_marked_stalled_while_its_batch_is_written_is_revived(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The liveness sweeper marks the run stalled after the batch's transaction read the run as running:
    the batch's activity update must see that and revive it, not write over the status it read."""
    run_id = new_run(client)
    write_actions = ingest_store.write_actions

    def write_then_sweep(conn: Connection, run: int, batch: Any) -> None:
        write_actions(conn, run, batch)
        assert run_store.mark_silent(conn, run, "running", RUN_STALLED, datetime.now(timezone.utc))

    monkeypatch.setattr(ingest_store, "write_actions", write_then_sweep)
    response = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=action_batch(4, step=1))
    assert response.status_code == 200, response.text
    assert client.get(f"{API_PREFIX}/runs/{run_id}").json()["status"] == "running"
