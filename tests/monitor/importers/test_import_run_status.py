"""An import never ends a run it did not start, and a run that keeps sending is alive.

An import into an existing run (`append`, or `replace` of a run a job is writing to) that stops part way,
interrupted or on an error, leaves the run's status as it was and says so; a run the import started is
marked `failed`, and that mark, like the liveness sweeper's `stalled`/`crashed`, gives way to the next
batch or heartbeat of a job writing to the run (`running` again, watched by the sweeper). Only an
explicit finish is final. In-process on both databases, through the API as a trainer uses it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contracts import metrics as M
from monitor.domain import Principal
from monitor.errors import ServiceUnavailable
from monitor.importers import ParsedLog, to_columns
from monitor.services.importing import ImportFailed, ImportInterrupted, ImportService

P = Principal()
RUNS = "/api/v1/runs"


@pytest.fixture
def state(client: TestClient) -> Any:
    return client.app.state.lldmon  # type: ignore[attr-defined]


@pytest.fixture
def service(state: Any) -> ImportService:
    return ImportService(state.db, state.runs, state.ingest, state.query, state.alerts)


def log_of(steps: range) -> ParsedLog:
    return to_columns({s: {M.LOSS: 1.0, M.REWARD_MEAN: 0.5} for s in steps})


def stop_after(chunks: int) -> Callable[[int], None]:
    """An `on_steps` that interrupts the import after `chunks` chunks, as Ctrl-C at a chunk boundary."""
    seen = iter(range(chunks - 1))

    def on_steps(n: int) -> None:
        if next(seen, None) is None:
            raise KeyboardInterrupt

    return on_steps


def trainer_run(client: TestClient, name: str) -> int:
    """A live trainer's run: registered, one batch logged."""
    run_id = int(client.post(RUNS, json={"name": name, "project": "p"}).json()["id"])
    log_batch(client, run_id, "trainer-1", [1000, 1001])
    return run_id


def log_batch(client: TestClient, run_id: int, batch: str, steps: list[int]) -> None:
    body = {"batch_id": batch, "steps": steps, "metrics": {"reward/mean": [0.5] * len(steps)}}
    response = client.post(f"{RUNS}/{run_id}/metrics", json=body)
    assert response.status_code == 200, response.text


def status(client: TestClient, run_id: int) -> str:
    return str(client.get(f"{RUNS}/{run_id}").json()["status"])


def swept(state: Any, seconds: float) -> list[tuple[int, str]]:
    """One sweep as if `seconds` had passed (thresholds set per run in the tests)."""
    changes: list[tuple[int, str]] = state.liveness.sweep(
        datetime.now(timezone.utc) + timedelta(seconds=seconds)
    )
    return changes


def test_an_interrupted_append_into_a_live_run_leaves_it_running(
    client: TestClient, state: Any, service: ImportService
) -> None:
    run_id = trainer_run(client, "live")
    client.put(f"{RUNS}/{run_id}/liveness", json={"stall_after_s": 60, "crash_after_s": 300})
    with pytest.raises(ImportInterrupted) as caught:
        service.import_log(
            P,
            log_of(range(100)),
            name="live",
            project="p",
            mode="append",
            chunk_steps=10,
            on_steps=stop_after(3),
        )
    stop = caught.value.stop
    assert not stop.marked_failed and stop.run.status == "running"
    assert (stop.written, stop.total) == (30, 100)
    assert status(client, run_id) == "running"
    # still the trainer's live run: the sweeper watches it, its next batch is just a batch
    assert swept(state, 61) == [(run_id, "stalled")]
    log_batch(client, run_id, "trainer-2", [1002])
    assert status(client, run_id) == "running"


@pytest.mark.parametrize("before", ["finished", "crashed", "failed"])
def test_an_append_that_fails_part_way_leaves_an_ended_run_as_it_was(
    client: TestClient, state: Any, service: ImportService, monkeypatch: pytest.MonkeyPatch, before: str
) -> None:
    run_id = trainer_run(client, f"ended-{before}")
    client.post(f"{RUNS}/{run_id}/finish", json={"status": before})
    ingest = state.ingest.ingest_metrics
    calls = iter(range(10**6))

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if next(calls) == 2:  # the import's third chunk
            raise ServiceUnavailable("database unavailable, retry later")
        return ingest(*args, **kwargs)

    monkeypatch.setattr(state.ingest, "ingest_metrics", flaky)
    with pytest.raises(ImportFailed) as caught:
        service.import_log(
            P, log_of(range(50)), name=f"ended-{before}", project="p", mode="append", chunk_steps=10
        )
    assert caught.value.message == "database unavailable, retry later" and caught.value.status_code == 503
    assert not caught.value.stop.marked_failed and caught.value.stop.written == 20
    assert status(client, run_id) == before
    # it is still the explicit finish it was: a late batch does not revive it
    log_batch(client, run_id, "late", [2000])
    assert status(client, run_id) == before


def test_a_run_the_import_started_is_marked_failed_and_a_job_writing_to_it_revives_it(
    client: TestClient, state: Any, service: ImportService
) -> None:
    with pytest.raises(ImportInterrupted) as caught:
        service.import_log(
            P, log_of(range(100)), name="imported", project="p", chunk_steps=10, on_steps=stop_after(2)
        )
    stop = caught.value.stop
    assert stop.marked_failed and stop.run.status == "failed" and stop.written == 20
    run_id = stop.run.id
    assert swept(state, 10**6) == []  # an ended run: not watched

    log_batch(client, run_id, "trainer-1", [500])  # a job is writing to it after all: alive
    run = client.get(f"{RUNS}/{run_id}").json()
    assert run["status"] == "running" and run["finished_at"] is None
    client.put(f"{RUNS}/{run_id}/liveness", json={"stall_after_s": 60, "crash_after_s": 300})
    assert swept(state, 61) == [(run_id, "stalled")]  # and watched again


def test_a_heartbeat_revives_a_run_an_import_marked_failed(
    client: TestClient, state: Any, service: ImportService
) -> None:
    with pytest.raises(ImportInterrupted) as caught:
        service.import_log(
            P, log_of(range(100)), name="imported", project="p", chunk_steps=10, on_steps=stop_after(1)
        )
    run_id = caught.value.stop.run.id
    assert status(client, run_id) == "failed"
    assert client.post(f"{RUNS}/{run_id}/heartbeat").json()["status"] == "running"
    assert status(client, run_id) == "running"


@pytest.mark.parametrize("final", ["finished", "failed", "crashed"])
def test_an_explicit_finish_is_final(client: TestClient, state: Any, final: str) -> None:
    run_id = trainer_run(client, f"done-{final}")
    client.post(f"{RUNS}/{run_id}/finish", json={"status": final})
    log_batch(client, run_id, "late", [2000])  # e.g. a spooled batch replayed after the finish
    assert status(client, run_id) == final
    assert client.post(f"{RUNS}/{run_id}/heartbeat").json()["status"] == final
    assert swept(state, 10**6) == []
    # registering again is an explicit restart
    assert client.post(RUNS, json={"name": f"done-{final}", "project": "p"}).json()["status"] == "running"


def test_the_sweepers_crashed_gives_way_to_a_batch(client: TestClient, state: Any) -> None:
    run_id = trainer_run(client, "silent")
    client.put(f"{RUNS}/{run_id}/liveness", json={"stall_after_s": 60, "crash_after_s": 300})
    assert swept(state, 301) == [(run_id, "crashed")]
    log_batch(client, run_id, "back", [1002])
    assert status(client, run_id) == "running"


@pytest.mark.parametrize("before", ["running", "stalled", "crashed", "finished", "failed"])
def test_a_complete_append_leaves_the_status_it_found(
    client: TestClient, state: Any, service: ImportService, before: str
) -> None:
    """A complete import ends only a run it created or an interrupted import's (`failed`): a live run
    (running, stalled) stays live, an ended one keeps its end."""
    run_id = trainer_run(client, f"complete-{before}")
    client.put(f"{RUNS}/{run_id}/liveness", json={"stall_after_s": 60, "crash_after_s": 300})
    if before == "stalled":
        assert swept(state, 61) == [(run_id, "stalled")]
    elif before != "running":
        client.post(f"{RUNS}/{run_id}/finish", json={"status": before})
    result = service.import_log(P, log_of(range(30)), name=f"complete-{before}", project="p", mode="append")
    expected = "finished" if before == "failed" else before
    assert result.run.status == expected and status(client, run_id) == expected


def test_replace_of_a_run_no_job_writes_to_is_the_imports_own(
    client: TestClient, service: ImportService
) -> None:
    """--replace deletes what an ended run held: the run is the import's, marked failed if it stops."""
    service.import_log(P, log_of(range(30)), name="old", project="p")
    with pytest.raises(ImportInterrupted) as caught:
        service.import_log(
            P,
            log_of(range(100)),
            name="old",
            project="p",
            mode="replace",
            chunk_steps=10,
            on_steps=stop_after(2),
        )
    assert caught.value.stop.marked_failed and status(client, caught.value.stop.run.id) == "failed"
