"""Retention of raw action records (issue 17 item 4), on every backend through the API.

Pruned steps have no records in GET /actions but keep their quantiles in GET /actions/summary
(`pruned` true); newer steps are untouched; a dry run writes nothing; a step written again after
pruning holds only its new records; the server's periodic pruner runs at start and on its interval
and survives a failing pass.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import select, update

from contracts.wire import API_PREFIX
from monitor.bootstrap import Services
from monitor.config import Settings, parse_duration
from monitor.db.engine import make_engine
from monitor.db.models import ActionBlock
from monitor.errors import NotFound
from monitor.services.retention import Pruner, PruneResult
from monitor.store._sql import table_of
from tests.monitor.api.helpers import action_batch, new_run

BLOCKS = table_of(ActionBlock)
OLD = datetime.now(timezone.utc) - timedelta(days=40)


def post_actions(client: TestClient, run_id: int, body: dict[str, Any]) -> None:
    response = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=body)
    assert response.status_code in (200, 201), response.text


def get(client: TestClient, path: str, **params: Any) -> dict[str, Any]:
    response = client.get(f"{API_PREFIX}{path}", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def age(db_url: str, run_id: int, steps: list[int], when: datetime = OLD) -> None:
    """Make these steps' blocks look last written at `when` (as if weeks had passed)."""
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            update(BLOCKS)
            .where((BLOCKS.c.run_id == run_id) & BLOCKS.c.step.in_(steps))
            .values(updated_at=when)
        )
    engine.dispose()


def block_rows(db_url: str, run_id: int) -> list[tuple[int, str, int, bool, datetime]]:
    """(step, source, n_records, has payload, updated_at) per block of the run."""
    engine = make_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                BLOCKS.c.step,
                BLOCKS.c.source,
                BLOCKS.c.n_records,
                BLOCKS.c.payload.is_not(None),
                BLOCKS.c.updated_at,
            )
            .where(BLOCKS.c.run_id == run_id)
            .order_by(BLOCKS.c.step, BLOCKS.c.source)
        ).all()
    engine.dispose()
    return [(int(s), str(src), int(n), bool(p), t) for s, src, n, p, t in rows]


def services_of(client: TestClient) -> Services:
    app: Any = client.app
    state: Services = app.state.lldmon
    return state


@pytest.fixture
def written(client: TestClient, db_url: str) -> int:
    """A run with loss blocks at steps 0-4 (3, 4, 5, 6, 7 records) and a probe block at step 1; steps 0
    and 1 last written 40 days ago."""
    run_id = new_run(client)
    for step in range(5):
        post_actions(client, run_id, action_batch(3 + step, step=step))
    post_actions(client, run_id, action_batch(2, step=1, source="probe"))
    age(db_url, run_id, [0, 1])
    return run_id


def test_prune_drops_raw_records_and_keeps_summaries(client: TestClient, db_url: str, written: int) -> None:
    run_id = written
    before_summary = get(client, f"/runs/{run_id}/actions/summary")
    before_new = get(client, f"/runs/{run_id}/actions", step_min=2)
    ages = {(s, src): t for s, src, _, _, t in block_rows(db_url, run_id)}

    result = services_of(client).retention.prune_actions(timedelta(days=30))

    assert result == PruneResult(blocks=3, records=3 + 4 + 2)
    old = get(client, f"/runs/{run_id}/actions", step_max=1)
    assert old["step"] == [] and old["delta"] == [] and old["traj_index"] == []
    assert get(client, f"/runs/{run_id}/actions", step_min=2) == before_new  # newer blocks untouched
    assert sorted(set(get(client, f"/runs/{run_id}/actions")["step"])) == [2, 3, 4]

    summary = get(client, f"/runs/{run_id}/actions/summary")
    assert summary["steps"] == [0, 1, 1, 2, 3, 4]
    assert summary["sources"] == ["loss", "loss", "probe", "loss", "loss", "loss"]
    assert summary["pruned"] == [True, True, True, False, False, False]
    assert not any(before_summary["pruned"])
    for key in ("steps", "sources", "levels", "n_all", "q_all", "n_pos", "q_pos"):
        assert summary[key] == before_summary[key], key  # the quantiles outlive the raw records
    assert summary["n_all"][0] == 3 and summary["q_all"][0][2] == pytest.approx(-0.1)

    rows = block_rows(db_url, run_id)
    assert [(s, src, n, p) for s, src, n, p, _ in rows] == [
        (0, "loss", 3, False),
        (1, "loss", 4, False),
        (1, "probe", 2, False),
        (2, "loss", 5, True),
        (3, "loss", 6, True),
        (4, "loss", 7, True),
    ]
    assert {(s, src): t for s, src, _, _, t in rows} == ages  # pruning is not a write: the age stays


def test_summary_route_filters_and_encodes_nonfinite(client: TestClient, written: int) -> None:
    run_id = written
    body = action_batch(2, step=7)
    body["delta"] = ["NaN", "Infinity"]  # no finite delta at this step: no quantiles
    post_actions(client, run_id, body)
    summary = get(client, f"/runs/{run_id}/actions/summary", step_min=1, step_max=7, source="loss")
    assert summary["run_id"] == run_id
    assert summary["steps"] == [1, 2, 3, 4, 7] and set(summary["sources"]) == {"loss"}
    assert summary["levels"] == [0.1, 0.25, 0.5, 0.75, 0.9]
    assert summary["q_all"][-1] == ["NaN"] * 5 and summary["q_pos"][-1] == ["NaN"] * 5
    assert all(len(row) == 5 for row in summary["q_all"] + summary["q_pos"])
    assert client.get(f"{API_PREFIX}/runs/999999/actions/summary").status_code == 404
    assert (
        client.get(f"{API_PREFIX}/runs/{run_id}/actions/summary", params={"source": "x"}).status_code == 422
    )


def test_dry_run_counts_and_writes_nothing(client: TestClient, db_url: str, written: int) -> None:
    run_id = written
    rows = block_rows(db_url, run_id)
    before = get(client, f"/runs/{run_id}/actions")
    retention = services_of(client).retention

    dry = retention.prune_actions(timedelta(days=30), dry_run=True)

    assert dry == PruneResult(blocks=3, records=9)
    assert block_rows(db_url, run_id) == rows
    assert get(client, f"/runs/{run_id}/actions") == before
    assert retention.prune_actions(timedelta(days=30)) == dry  # the dry run predicted the real one
    assert retention.prune_actions(timedelta(days=30), dry_run=True) == PruneResult(0, 0)


def test_prune_is_idempotent_and_scoped_to_a_run(client: TestClient, db_url: str, written: int) -> None:
    other = new_run(client, "run-b")
    post_actions(client, other, action_batch(4, step=0))
    age(db_url, other, [0])
    retention = services_of(client).retention

    assert retention.prune_actions(timedelta(days=30), other) == PruneResult(1, 4)
    assert retention.prune_actions(timedelta(days=30), other) == PruneResult(0, 0)
    assert [p for *_, p, _ in block_rows(db_url, written)][:3] == [True, True, True]  # other run untouched
    assert retention.prune_actions(timedelta(days=30)) == PruneResult(3, 9)
    assert retention.prune_actions(timedelta(days=30)) == PruneResult(0, 0)
    assert retention.prune_actions(timedelta(days=50)) == PruneResult(0, 0)  # 40 days is not older than 50
    with pytest.raises(NotFound):
        retention.prune_actions(timedelta(days=30), 999_999)


def test_concurrent_pruners_prune_each_block_once(client: TestClient, db_url: str, written: int) -> None:
    """Several server processes prune at once: every block is counted by exactly one of them."""
    run_id = written
    age(db_url, run_id, [0, 1, 2, 3, 4])
    retention = services_of(client).retention
    results: list[PruneResult] = []
    barrier = threading.Barrier(4)

    def prune() -> None:
        barrier.wait()
        results.append(retention.prune_actions(timedelta(days=30)))

    threads = [threading.Thread(target=prune) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r.blocks for r in results) == 6
    assert sum(r.records for r in results) == 3 + 4 + 5 + 6 + 7 + 2


def test_step_written_again_after_pruning_holds_only_new_records(
    client: TestClient, db_url: str, written: int
) -> None:
    run_id = written
    services_of(client).retention.prune_actions(timedelta(days=30))
    body = action_batch(2, step=0)
    body["traj_index"] = [100, 101]
    body["delta"] = [0.5, 0.25]
    post_actions(client, run_id, body)

    records = get(client, f"/runs/{run_id}/actions", step_max=0)
    assert records["traj_index"] == [100, 101] and records["delta"] == [0.5, 0.25]
    summary = get(client, f"/runs/{run_id}/actions/summary", step_max=1)
    assert summary["pruned"] == [False, True, True]
    assert summary["n_all"][0] == 2 and summary["q_all"][0][2] == pytest.approx(0.375)
    rows = block_rows(db_url, run_id)
    assert rows[0][:4] == (0, "loss", 2, True) and rows[0][4] > OLD + timedelta(days=39)
    assert services_of(client).retention.prune_actions(timedelta(days=30)) == PruneResult(0, 0)


# the setting and the server's periodic pruner


def test_setting_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLDMON_ACTIONS_RETENTION", raising=False)
    assert Settings().actions_retention is None
    assert Settings().actions_prune_seconds == 3600
    monkeypatch.setenv("LLDMON_ACTIONS_RETENTION", "30d")
    assert Settings().actions_retention == timedelta(days=30)
    monkeypatch.setenv("LLDMON_ACTIONS_RETENTION", "")
    assert Settings().actions_retention is None
    for bad in ("30", "30 days", "0d", "-1h", "1.5d", "99999d"):
        monkeypatch.setenv("LLDMON_ACTIONS_RETENTION", bad)
        with pytest.raises(ValidationError, match="actions_retention"):
            Settings()
    assert [parse_duration(t) for t in ("90m", "12h", "2w", "45s")] == [
        timedelta(minutes=90),
        timedelta(hours=12),
        timedelta(weeks=2),
        timedelta(seconds=45),
    ]


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_server_prunes_at_start_and_then_periodically(settings: Settings, db_url: str) -> None:
    from monitor.api.app import create_app

    # Data from before this server started: pruned by the pass at start.
    setup = create_app(settings)
    with TestClient(setup) as client:
        run_id = new_run(client)
        post_actions(client, run_id, action_batch(3, step=0))
        post_actions(client, run_id, action_batch(3, step=1))
    age(db_url, run_id, [0])

    fast: FastAPI = create_app(
        settings.model_copy(update={"actions_retention": timedelta(days=30), "actions_prune_seconds": 0.05})
    )
    with TestClient(fast) as client:
        pruner: Pruner = fast.state.pruner
        wait_for(lambda: pruner.passes >= 1)
        assert get(client, f"/runs/{run_id}/actions", step_max=0)["step"] == []
        assert get(client, f"/runs/{run_id}/actions/summary")["pruned"] == [True, False]
        age(db_url, run_id, [1])  # weeks later: the next pass finds step 1 old too
        wait_for(lambda: get(client, f"/runs/{run_id}/actions/summary")["pruned"] == [True, True])
        passes = pruner.passes
        wait_for(lambda: pruner.passes >= passes + 2)
    assert not pruner._thread.is_alive()  # stopped with the app
    fast.state.lldmon.db.dispose()
    setup.state.lldmon.db.dispose()


def test_no_pruner_without_the_setting(app: FastAPI) -> None:
    with TestClient(app):
        assert app.state.pruner is None


class FlakyRetention:
    """Fails its first two passes (a database restart), then works."""

    def __init__(self) -> None:
        self.calls = 0

    def prune_actions(self, older_than: timedelta) -> PruneResult:
        self.calls += 1
        if self.calls <= 2:
            raise RuntimeError("database restarting")
        return PruneResult(1, 5)


def test_a_failing_pass_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    flaky = FlakyRetention()
    pruner = Pruner(flaky, timedelta(days=1), 0.01)  # type: ignore[arg-type]
    with caplog.at_level("INFO", logger="lldmon.retention"):
        pruner.start()
        wait_for(lambda: pruner.passes >= 4)
        pruner.stop()
    assert not pruner._thread.is_alive()
    assert flaky.calls >= 4
    messages = [r.getMessage() for r in caplog.records]
    assert sum("pruning action records failed" in m for m in messages) == 2
    assert any("pruned 1 action blocks (5 records)" in m for m in messages)
