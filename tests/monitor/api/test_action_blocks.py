"""Action records stored as per-step blocks (issue 17), through the API and the services: a step sent in
several batches is the union, a re-sent record overwrites, sources stay apart, `limit` may cut a block,
concurrent writers of one step lose nothing, and the stored summaries are numpy's quantiles."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from contracts.wire import API_PREFIX
from monitor.db.engine import make_engine
from monitor.domain import ActionColumns, Principal
from monitor.store import Database
from monitor.store import ingest as ingest_store
from monitor.store import series as series_store
from monitor.store.action_codec import SUMMARY_LEVELS, decode_block
from tests.conftest import ALL_BACKENDS, migrated_database
from tests.monitor.api.helpers import action_batch, new_run


# Also on PostgreSQL hash-partitioned by run_id, like the other ingest tests.
@pytest.fixture(scope="session", params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def migrated_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from migrated_database(backend, tmp_path_factory)


def post(client: TestClient, run_id: int, body: dict[str, Any]) -> None:
    response = client.post(f"{API_PREFIX}/runs/{run_id}/actions", json=body)
    assert response.status_code == 200, response.text


def read(client: TestClient, run_id: int, **params: Any) -> dict[str, Any]:
    response = client.get(f"{API_PREFIX}/runs/{run_id}/actions", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def records(n: int, step: int, traj: list[int], source: str = "loss", delta: float = 0.0) -> dict[str, Any]:
    body = action_batch(n, step=step, source=source)
    body["traj_index"] = traj
    body["delta"] = [delta + t for t in traj]
    return body


def blocks(client: TestClient) -> list[tuple[Any, ...]]:
    engine = client.app.state.lldmon.db.engine  # type: ignore[attr-defined]
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT step, source, n_records FROM action_blocks ORDER BY step, source"))
        return [tuple(r) for r in rows]


def test_a_step_sent_in_three_batches_reads_back_as_the_union(client: TestClient) -> None:
    run_id = new_run(client)
    post(client, run_id, records(3, 7, [6, 7, 8]))
    post(client, run_id, records(3, 7, [0, 1, 2]))
    post(client, run_id, records(3, 7, [3, 4, 5]))
    stored = read(client, run_id)
    assert stored["traj_index"] == list(range(9))
    assert stored["delta"] == [float(t) for t in range(9)]
    assert stored["step"] == [7] * 9
    assert blocks(client) == [(7, "loss", 9)]


def test_a_re_sent_record_overwrites_and_the_rest_stays(client: TestClient) -> None:
    run_id = new_run(client)
    post(client, run_id, records(4, 2, [0, 1, 2, 3]))
    again = records(2, 2, [1, 3], delta=100.0)
    again["reward"] = ["Infinity", "NaN"]
    post(client, run_id, again)  # a new batch id: the later values win by key
    stored = read(client, run_id)
    assert stored["traj_index"] == [0, 1, 2, 3]
    assert stored["delta"] == [0.0, 101.0, 2.0, 103.0]
    assert stored["reward"] == [1.0, "Infinity", 1.0, "NaN"]
    assert blocks(client) == [(2, "loss", 4)]


def test_a_record_listed_twice_in_one_batch_keeps_the_later(client: TestClient) -> None:
    run_id = new_run(client)
    body = records(3, 1, [0, 1, 0])
    body["delta"] = [1.0, 2.0, 3.0]
    post(client, run_id, body)
    assert read(client, run_id)["delta"] == [3.0, 2.0]


def test_two_sources_at_one_step_are_two_blocks_read_in_order(client: TestClient) -> None:
    run_id = new_run(client)
    post(client, run_id, records(2, 4, [0, 1], source="probe", delta=10.0))
    post(client, run_id, records(3, 4, [0, 1, 2], source="loss"))
    post(client, run_id, records(1, 3, [5], source="probe"))
    stored = read(client, run_id)
    assert list(zip(stored["step"], stored["source"], stored["traj_index"], strict=True)) == [
        (3, "probe", 5),
        (4, "loss", 0),
        (4, "loss", 1),
        (4, "loss", 2),
        (4, "probe", 0),
        (4, "probe", 1),
    ]
    assert read(client, run_id, source="probe")["delta"] == [5.0, 10.0, 11.0]
    assert read(client, run_id, step_min=4, step_max=4, source="loss")["traj_index"] == [0, 1, 2]
    assert blocks(client) == [(3, "probe", 1), (4, "loss", 3), (4, "probe", 2)]


def test_mixed_batch_of_several_steps_and_sources(client: TestClient) -> None:
    run_id = new_run(client)
    body = action_batch(6)
    body["step"] = [2, 1, 2, 1, 2, 1]
    body["source"] = ["loss", "probe", "probe", "loss", "loss", "probe"]
    body["traj_index"] = [5, 4, 3, 2, 1, 0]
    post(client, run_id, body)
    stored = read(client, run_id)
    assert list(zip(stored["step"], stored["source"], stored["traj_index"], strict=True)) == [
        (1, "loss", 2),
        (1, "probe", 0),
        (1, "probe", 4),
        (2, "loss", 1),
        (2, "loss", 5),
        (2, "probe", 3),
    ]


def test_limit_cuts_in_the_middle_of_a_block(client: TestClient) -> None:
    run_id = new_run(client)
    for step in range(4):
        post(client, run_id, records(5, step, list(range(5))))
    stored = read(client, run_id, limit=7)
    assert stored["step"] == [0] * 5 + [1] * 2
    assert stored["traj_index"] == [0, 1, 2, 3, 4, 0, 1]
    assert len(read(client, run_id, limit=5)["step"]) == 5
    assert read(client, run_id, limit=1, step_min=3)["step"] == [3]
    assert len(read(client, run_id, limit=100)["step"]) == 20


def test_pruned_blocks_hold_no_records_but_keep_their_summary(client: TestClient) -> None:
    run_id = new_run(client)
    post(client, run_id, records(3, 1, [0, 1, 2]))
    post(client, run_id, records(3, 2, [0, 1, 2]))
    engine = client.app.state.lldmon.db.engine  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.execute(text("UPDATE action_blocks SET payload = NULL WHERE step = 1"))
    assert read(client, run_id)["step"] == [2, 2, 2]
    assert read(client, run_id, limit=2)["step"] == [2, 2]
    state = client.app.state.lldmon  # type: ignore[attr-defined]
    summaries = state.query.action_summaries(Principal(), run_id, None, None, None)
    assert summaries.steps == [1, 2] and summaries.pruned == [True, False]
    assert summaries.n_all == [3, 3]
    post(client, run_id, records(1, 1, [7]))  # new records at a pruned step replace it
    assert read(client, run_id, step_max=1)["traj_index"] == [7]


def test_summaries_are_numpy_quantiles_per_step_and_source(client: TestClient) -> None:
    run_id = new_run(client)
    rng = np.random.default_rng(5)
    sent: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
    for step in (3, 1):
        for source in ("loss", "probe"):
            n = 40 if source == "loss" else 3
            body = action_batch(n, step=step, source=source)
            delta = rng.normal(size=n)
            delta[0] = math.nan
            delta[1] = math.inf
            advantage = rng.normal(size=n)
            if source == "probe":
                advantage[:] = -1.0
            body["delta"] = [None if math.isnan(d) else ("Infinity" if math.isinf(d) else d) for d in delta]
            body["advantage"] = advantage.tolist()
            post(client, run_id, body)
            sent[(step, source)] = (delta, advantage)
    state = client.app.state.lldmon  # type: ignore[attr-defined]
    summaries = state.query.action_summaries(Principal(), run_id, None, None, None)
    assert list(zip(summaries.steps, summaries.sources, strict=True)) == [
        (1, "loss"),
        (1, "probe"),
        (3, "loss"),
        (3, "probe"),
    ]
    assert summaries.levels == SUMMARY_LEVELS and summaries.pruned == [False] * 4
    for i, key in enumerate(zip(summaries.steps, summaries.sources, strict=True)):
        delta, advantage = sent[key]
        finite = delta[np.isfinite(delta)]
        pos = delta[np.isfinite(delta) & (advantage > 0)]
        assert summaries.n_all[i] == len(finite)
        np.testing.assert_allclose(summaries.q_all[i], np.quantile(finite, SUMMARY_LEVELS))
        assert summaries.n_pos[i] == len(pos)
        if len(pos):
            np.testing.assert_allclose(summaries.q_pos[i], np.quantile(pos, SUMMARY_LEVELS))
        else:
            assert all(math.isnan(q) for q in summaries.q_pos[i])
    window = state.query.action_summaries(Principal(), run_id, 2, None, "probe")
    assert (window.steps, window.sources) == ([3], ["probe"])


def test_summaries_need_access_to_the_run(client: TestClient) -> None:
    from monitor.errors import NotFound

    state = client.app.state.lldmon  # type: ignore[attr-defined]
    with pytest.raises(NotFound):
        state.query.action_summaries(Principal(), 4242, None, None, None)


def columns(step: int, traj: range, writer: int) -> ActionColumns:
    n = len(traj)
    return ActionColumns(
        step=[step] * n,
        traj_index=list(traj),
        action_index=[0] * n,
        n_tokens=[writer] * n,
        delta=[float(t) for t in traj],
        old_logp_mean=[None] * n,
        advantage=[1.0] * n,
        reward=[0.0] * n,
        is_answer=[False] * n,
        source=["loss"] * n,
    )


def test_concurrent_writers_of_one_step_lose_nothing(client: TestClient, db_url: str) -> None:
    """Eight writers, each in its own transaction, add their own trajectories to the same two steps at
    once (one of them new): on PostgreSQL the inserts race and the losers merge into the winner's row."""
    run_id = new_run(client)
    ingest_store_db = Database(make_engine(db_url))
    with ingest_store_db.write() as conn:
        ingest_store.write_actions(conn, run_id, columns(0, range(0, 1), 99))
    writers, per_writer, rounds = 8, 50, 3
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for r in range(rounds):
                barrier.wait(timeout=30)
                lo = 1 + (r * writers + w) * per_writer
                batch = columns(0, range(lo, lo + per_writer), w)
                both = ActionColumns(
                    **{
                        name: getattr(batch, name) + getattr(columns(1, range(lo, lo + per_writer), w), name)
                        for name in ActionColumns.__dataclass_fields__
                    }
                )
                with ingest_store_db.write() as conn:
                    ingest_store.write_actions(conn, run_id, both)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    with ingest_store_db.read() as conn:
        stored = series_store.read_actions(conn, run_id, None, None, None, 100_000)
    ingest_store_db.dispose()
    total = writers * per_writer * rounds
    step0 = [t for s, t in zip(stored["step"], stored["traj_index"], strict=True) if s == 0]
    step1 = [t for s, t in zip(stored["step"], stored["traj_index"], strict=True) if s == 1]
    assert step0 == list(range(total + 1))
    assert step1 == list(range(1, total + 1))
    assert blocks(client) == [(0, "loss", total + 1), (1, "loss", total)]


def test_a_limited_read_decodes_only_the_blocks_it_needs(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = new_run(client)
    for step in range(6):
        post(client, run_id, records(5, step, list(range(5))))
    decoded: list[int] = []
    real = decode_block

    def counting(payload: bytes) -> Any:
        block = real(payload)
        decoded.append(len(block))
        return block

    monkeypatch.setattr(series_store, "decode_block", counting)
    assert len(read(client, run_id, limit=7)["step"]) == 7
    assert decoded == [5, 5]


def test_a_search_r1_step_costs_at_most_24_bytes_per_record_on_postgres(
    client: TestClient, db_url: str, backend: str
) -> None:
    """The issue's storage target, on disk: heap, TOAST and indexes (all partitions) per record."""
    if not backend.startswith("postgres"):
        pytest.skip("pg_total_relation_size is PostgreSQL's")
    from monitor.store.action_codec import ACTION_FIELDS, search_r1_step

    run_id = new_run(client)
    db = Database(make_engine(db_url))
    with db.write() as conn:  # the space earlier tests' deleted rows still hold is not this step's
        conn.execute(text("TRUNCATE action_blocks"))
    rng = np.random.default_rng(0)
    n_records = 0
    for step in range(20):
        block = search_r1_step(rng)
        n = len(block)
        batch = ActionColumns(
            step=[step] * n,
            source=["loss"] * n,
            **{name: getattr(block, name).tolist() for name in ACTION_FIELDS},
        )
        with db.write() as conn:
            ingest_store.write_actions(conn, run_id, batch)
        n_records += n
    with db.read() as conn:
        size = conn.execute(
            text(
                "SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) "
                "FROM pg_partition_tree('action_blocks')), pg_total_relation_size('action_blocks'))"
            )
        ).scalar_one()
    db.dispose()
    assert size / n_records <= 24, f"{size / n_records:.1f} bytes per record"


def test_a_block_deleted_between_insert_and_merge_is_inserted_again(
    client: TestClient, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The INSERT skipped a key whose row a concurrent transaction then deleted (run data cleared):
    the merge finds nothing to lock and the block is inserted in a second round, not lost."""
    run_id = new_run(client)
    real = ingest_store._insert_new
    calls: list[int] = []

    def first_sees_a_row_that_then_vanishes(conn: Any, run: int, blocks: Any) -> set[tuple[int, str]]:
        calls.append(len(blocks))
        return set() if len(calls) == 1 else real(conn, run, blocks)

    monkeypatch.setattr(ingest_store, "_insert_new", first_sees_a_row_that_then_vanishes)
    db = Database(make_engine(db_url))
    with db.write() as conn:
        ingest_store.write_actions(conn, run_id, columns(4, range(3), 1))
    db.dispose()
    assert calls == [1, 1]
    assert read(client, run_id)["traj_index"] == [0, 1, 2]
