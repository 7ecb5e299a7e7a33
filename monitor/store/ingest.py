"""The ingest hot path: batch ledger and bulk writes, no per-row ORM work.

Metrics, PostgreSQL: COPY inside a savepoint; if the batch overwrites existing points (a resumed run
re-logging steps), the savepoint is rolled back and the batch is upserted instead (later wins).
SQLite: one executemany upsert.

Actions: one block per (run, step, source) (`action_codec`). A batch is grouped with numpy, new blocks
are inserted in one statement (ON CONFLICT DO NOTHING RETURNING their keys); the blocks that already
existed (a step split over several batches, a re-sent step) are locked, merged (new records win by key)
and updated. Concurrent writers of one step on PostgreSQL: the second INSERT waits for the first to
commit and then finds the row, which it locks and merges into, so no record is lost. SQLite has one
writer at a time (`Database` holds a process-wide write lock, SQLite a file lock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import (
    ColumnElement,
    Connection,
    Executable,
    Table,
    bindparam,
    delete,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from monitor.db.models import ActionBlock, IngestBatch, Run, StepMetric
from monitor.domain import ActionColumns, MetricsColumns
from monitor.store._sql import table_of, upsert_many
from monitor.store.action_codec import Block, decode_block, encode_block, merge_blocks, summarize

ingest_batches = table_of(IngestBatch)
action_blocks = table_of(ActionBlock)
step_metrics = table_of(StepMetric)
runs = table_of(Run)

METRIC_COLUMNS = ("run_id", "name", "step", "value")
METRIC_KEYS = ("run_id", "name", "step")


def _insert_ignoring(table: Table, *returning: ColumnElement[Any]) -> dict[str, Executable]:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING `returning`, per dialect name: the rows that come back
    are the rows inserted (rowcount is not reliable with RETURNING)."""
    return {
        name: insert(table).on_conflict_do_nothing().returning(*returning)
        for name, insert in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
    }


# Statements built once: every batch claims its id in the ledger, every action batch inserts blocks.
_CLAIM = _insert_ignoring(ingest_batches, ingest_batches.c.run_id)
_INSERT_BLOCKS = _insert_ignoring(action_blocks, action_blocks.c.step, action_blocks.c.source)
_LEDGER_ENTRY = select(ingest_batches.c.n_rows, ingest_batches.c.digest).where(
    ingest_batches.c.run_id == bindparam("run_id"),
    ingest_batches.c.kind == bindparam("kind"),
    ingest_batches.c.batch_id == bindparam("batch_id"),
)


@dataclass(frozen=True)
class LedgerEntry:
    """What the ledger holds for a batch id already received."""

    n_rows: int
    digest: str | None
    """None for entries written before the ledger stored digests (revision 0003)."""


def claim_batch(
    conn: Connection, run_id: int, kind: str, batch_id: str, digest: str, n_rows: int
) -> LedgerEntry | None:
    """Record the batch in the ledger of its run and kind. Returns None if new, else the entry first
    recorded under that id (the caller compares digests).

    The ledger row is written in the same transaction as the data, so a batch is either stored
    with its ledger entry or not at all; a concurrent duplicate waits on the key and then sees it.
    """
    key = {"run_id": run_id, "kind": kind, "batch_id": batch_id}
    claimed = conn.execute(_CLAIM[conn.dialect.name], {**key, "digest": digest, "n_rows": n_rows}).first()
    if claimed is not None:
        return None
    stored = conn.execute(_LEDGER_ENTRY, key).one()
    return LedgerEntry(int(stored.n_rows), stored.digest)


def write_metrics(conn: Connection, run_id: int, batch: MetricsColumns) -> None:
    rows = [(run_id, n, s, v) for n, s, v in zip(batch.names, batch.steps, batch.values, strict=True)]
    _write(conn, "step_metrics", METRIC_COLUMNS, METRIC_KEYS, rows)


def truncate_history(conn: Connection, run_id: int, to_step: int) -> None:
    """Delete the run's metrics and action records after `to_step` and make it its last step (a
    rollback: those steps are trained again); counts as a rewrite of history (`runs.history_rev`)."""
    conn.execute(delete(step_metrics).where(step_metrics.c.run_id == run_id, step_metrics.c.step > to_step))
    conn.execute(
        delete(action_blocks).where(action_blocks.c.run_id == run_id, action_blocks.c.step > to_step)
    )
    conn.execute(
        update(runs).where(runs.c.id == run_id).values(last_step=to_step, history_rev=runs.c.history_rev + 1)
    )


def write_actions(conn: Connection, run_id: int, batch: ActionColumns) -> None:
    """Merge the batch into the run's action blocks, one per (step, source) it touches."""
    pending = {(step, source): block for step, source, block in group_actions(batch)}
    while pending:  # a second round only if a block was deleted (run data cleared) while we merged
        inserted = _insert_new(conn, run_id, pending)
        pending = _merge_into_existing(
            conn, run_id, {key: block for key, block in pending.items() if key not in inserted}
        )


def group_actions(batch: ActionColumns) -> list[tuple[int, str, Block]]:
    """The batch as one block per (step, source), ordered by (step, source); of records listed twice
    the later wins. One lexsort over the batch, no per-record Python."""
    if len(batch) == 0:
        return []
    step = np.asarray(batch.step, dtype=np.int64)
    if "probe" in batch.source:
        probe = np.asarray(batch.source) == "probe"
    else:  # the usual batch: one source (a C-speed scan instead of a string array)
        probe = np.zeros(len(batch), dtype=bool)
    traj = np.asarray(batch.traj_index, dtype=np.int64)
    action = np.asarray(batch.action_index, dtype=np.int64)
    order = np.lexsort((action, traj, probe, step))  # stable: equal keys keep their batch order
    step, probe, traj, action = step[order], probe[order], traj[order], action[order]
    new_key = (step[1:] != step[:-1]) | (probe[1:] != probe[:-1])
    last_of_key = np.r_[new_key | (traj[1:] != traj[:-1]) | (action[1:] != action[:-1]), True]
    keep = order[last_of_key]
    step, probe, traj, action = step[last_of_key], probe[last_of_key], traj[last_of_key], action[last_of_key]
    columns = {
        "n_tokens": np.asarray(batch.n_tokens, dtype=np.int64)[keep],
        "delta": np.asarray(batch.delta, dtype=np.float64)[keep],  # None -> NaN
        "old_logp_mean": np.asarray(batch.old_logp_mean, dtype=np.float64)[keep],
        "advantage": np.asarray(batch.advantage, dtype=np.float64)[keep],
        "reward": np.asarray(batch.reward, dtype=np.float64)[keep],
        "is_answer": np.asarray(batch.is_answer, dtype=bool)[keep],
    }
    starts = np.flatnonzero(np.r_[True, (step[1:] != step[:-1]) | (probe[1:] != probe[:-1])])
    ends = np.r_[starts[1:], len(step)]
    return [
        (
            int(step[a]),
            "probe" if probe[a] else "loss",
            Block(traj[a:b], action[a:b], **{name: values[a:b] for name, values in columns.items()}),
        )
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    ]


def _block_row(run_id: int, step: int, source: str, block: Block) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "step": step,
        "source": source,
        "n_records": len(block),
        "payload": encode_block(block),
        "summary": summarize(block),
    }


def _insert_new(conn: Connection, run_id: int, blocks: dict[tuple[int, str], Block]) -> set[tuple[int, str]]:
    """INSERT the blocks in one statement, skipping keys that exist; the keys inserted."""
    rows = [_block_row(run_id, step, source, block) for (step, source), block in sorted(blocks.items())]
    return {
        (int(step), str(source)) for step, source in conn.execute(_INSERT_BLOCKS[conn.dialect.name], rows)
    }


def _merge_into_existing(
    conn: Connection, run_id: int, new: dict[tuple[int, str], Block]
) -> dict[tuple[int, str], Block]:
    """Lock the existing blocks (in key order, so concurrent writers cannot deadlock), merge, update;
    returns the blocks whose row is gone (deleted since the INSERT saw it), to be inserted again.

    A pruned block (payload NULL) has no records left to merge with: the new records replace it."""
    if not new:
        return {}
    query = (
        select(action_blocks.c.step, action_blocks.c.source, action_blocks.c.payload)
        .where(
            action_blocks.c.run_id == run_id,
            tuple_(action_blocks.c.step, action_blocks.c.source).in_(sorted(new)),
        )
        .order_by(action_blocks.c.step, action_blocks.c.source)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    left = dict(new)
    updates = []
    for step, source, payload in conn.execute(query):
        key = (int(step), str(source))
        block = left.pop(key)
        if payload is not None:
            block = merge_blocks(decode_block(payload), block)
        row = _block_row(run_id, *key, block)
        updates.append({f"b_{k}" if k in ("run_id", "step", "source") else k: v for k, v in row.items()})
    if updates:
        conn.execute(
            update(action_blocks)
            .where(
                action_blocks.c.run_id == bindparam("b_run_id"),
                action_blocks.c.step == bindparam("b_step"),
                action_blocks.c.source == bindparam("b_source"),
            )
            .values(updated_at=func.now()),  # n_records, payload and summary: from each parameter set
            updates,
        )
    return left


def _write(
    conn: Connection, table: str, columns: Sequence[str], keys: Sequence[str], rows: list[tuple[Any, ...]]
) -> None:
    if not rows:
        return
    if conn.dialect.name == "postgresql" and _try_copy(conn, table, columns, rows):
        return
    upsert_many(conn, table, columns, keys, rows)


def _try_copy(conn: Connection, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> bool:
    """COPY the rows in a savepoint; False (and nothing written) if some key already exists.

    The COPY runs on the driver connection, past SQLAlchemy, which would otherwise discard a connection
    that an exception left mid-command. Done here: a KeyboardInterrupt inside psycopg's wait can leave
    the connection in COPY state, where the transaction's ROLLBACK fails ("another command is already in
    progress") or waits for data that never comes. Such a connection is invalidated (closed, dropped from
    the pool; the server rolls the transaction back), so the caller's next transaction gets a fresh one."""
    import psycopg
    from psycopg.pq import TransactionStatus

    savepoint = conn.begin_nested()
    raw = conn.connection.driver_connection
    assert raw is not None
    try:
        with raw.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    except psycopg.errors.UniqueViolation:
        savepoint.rollback()
        return False
    except BaseException as exc:
        if raw.info.transaction_status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            conn.invalidate(exc if isinstance(exc, Exception) else None)
        raise
    savepoint.commit()
    return True
