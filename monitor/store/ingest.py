"""The ingest hot path: batch ledger and bulk writes, no per-row ORM work.

PostgreSQL: COPY inside a savepoint; if the batch overwrites existing points (a resumed run
re-logging steps), the savepoint is rolled back and the batch is upserted instead (later wins).
SQLite: one executemany upsert.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from monitor.db.models import IngestBatch
from monitor.domain import ActionColumns, MetricsColumns
from monitor.store._sql import insert_ignore, table_of, upsert_many

ingest_batches = table_of(IngestBatch)

METRIC_COLUMNS = ("run_id", "name", "step", "value")
METRIC_KEYS = ("run_id", "name", "step")
ACTION_COLUMNS = (
    "run_id",
    "step",
    "source",
    "traj_index",
    "action_index",
    "n_tokens",
    "delta",
    "old_logp_mean",
    "advantage",
    "reward",
    "is_answer",
)
ACTION_KEYS = ("run_id", "step", "source", "traj_index", "action_index")


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
    row = {"run_id": run_id, "kind": kind, "batch_id": batch_id, "digest": digest, "n_rows": n_rows}
    if insert_ignore(conn, ingest_batches, row):
        return None
    stored = conn.execute(
        select(ingest_batches.c.n_rows, ingest_batches.c.digest).where(
            ingest_batches.c.run_id == run_id,
            ingest_batches.c.kind == kind,
            ingest_batches.c.batch_id == batch_id,
        )
    ).one()
    return LedgerEntry(int(stored.n_rows), stored.digest)


def write_metrics(conn: Connection, run_id: int, batch: MetricsColumns) -> None:
    rows = [(run_id, n, s, v) for n, s, v in zip(batch.names, batch.steps, batch.values, strict=True)]
    _write(conn, "step_metrics", METRIC_COLUMNS, METRIC_KEYS, rows)


def write_actions(conn: Connection, run_id: int, batch: ActionColumns) -> None:
    rows = list(
        zip(
            [run_id] * len(batch),
            batch.step,
            batch.source,
            batch.traj_index,
            batch.action_index,
            batch.n_tokens,
            batch.delta,
            batch.old_logp_mean,
            batch.advantage,
            batch.reward,
            batch.is_answer,
            strict=True,
        )
    )
    _write(conn, "action_records", ACTION_COLUMNS, ACTION_KEYS, rows)


def _write(
    conn: Connection, table: str, columns: Sequence[str], keys: Sequence[str], rows: list[tuple[Any, ...]]
) -> None:
    if not rows:
        return
    if conn.dialect.name == "postgresql" and _try_copy(conn, table, columns, rows):
        return
    upsert_many(conn, table, columns, keys, rows)


def _try_copy(conn: Connection, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> bool:
    """COPY the rows in a savepoint; False (and nothing written) if some key already exists."""
    import psycopg

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
    savepoint.commit()
    return True
