"""action blocks (issue 17): a step's action records as one encoded row per (run, step, source)

`action_records` (one row per record, about 161 bytes each on PostgreSQL) becomes `action_blocks`: the
records of one (run, step, source) encoded by `monitor.store.action_codec` (about 10 bytes a record),
with the record count and a per-step quantile summary that survive retention pruning (payload NULL).
Keyed by run first, like every large table, so it can be hash-partitioned by run_id.

Upgrading converts every record, run by run, a bounded number of records at a time (keyset pages on
the primary key, grouped with numpy): a large table never has to fit in memory. Downgrading recreates
`action_records` exactly as revision 0001 made it and expands the blocks back into rows (NaN as NULL,
as the old store wrote it); blocks already pruned by retention have no records left to restore, only
their summary, which is dropped.

The conversion decodes with `monitor.store.action_codec`, whose `decode_block` keeps reading every
format version it ever wrote, so this revision stays valid as the codec evolves. The page size is
`config.attributes["lldmon.migration_chunk_rows"]` (tests make it tiny to cross page boundaries).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import context, op

from monitor.store.action_codec import (
    ACTION_FIELDS,
    FLOAT_FIELDS,
    block_from_columns,
    concat_columns,
    decode_block,
    encode_block,
    summarize,
)

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

CHUNK_ROWS = 200_000
_RECORD_COLUMNS = ("step", "source", *ACTION_FIELDS)

_records = sa.table(
    "action_records",
    sa.column("run_id", sa.Integer),
    sa.column("step", sa.BigInteger),
    sa.column("source", sa.String),
    sa.column("traj_index", sa.Integer),
    sa.column("action_index", sa.Integer),
    sa.column("n_tokens", sa.Integer),
    sa.column("delta", sa.Double),
    sa.column("old_logp_mean", sa.Double),
    sa.column("advantage", sa.Double),
    sa.column("reward", sa.Double),
    sa.column("is_answer", sa.Boolean),
)
_blocks = sa.table(
    "action_blocks",
    sa.column("run_id", sa.Integer),
    sa.column("step", sa.BigInteger),
    sa.column("source", sa.String),
    sa.column("n_records", sa.Integer),
    sa.column("payload", sa.LargeBinary),
    sa.column("summary", sa.JSON),
)


def _chunk_rows() -> int:
    return int(context.config.attributes.get("lldmon.migration_chunk_rows", CHUNK_ROWS))


def upgrade() -> None:
    op.create_table(
        "action_blocks",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("n_records", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.CheckConstraint("source IN ('loss', 'probe')", name=op.f("ck_action_blocks_source")),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_action_blocks_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "step", "source", name=op.f("pk_action_blocks")),
    )
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        # payloads are zlib-compressed already: TOAST should store them out of line without trying pglz
        op.execute("ALTER TABLE action_blocks ALTER COLUMN payload SET STORAGE EXTERNAL")
    records_to_blocks(conn, _chunk_rows())
    op.drop_table("action_records")


def downgrade() -> None:
    op.create_table(
        "action_records",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("traj_index", sa.Integer(), nullable=False),
        sa.Column("action_index", sa.Integer(), nullable=False),
        sa.Column("n_tokens", sa.Integer(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=True),
        sa.Column("old_logp_mean", sa.Double(), nullable=True),
        sa.Column("advantage", sa.Double(), nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("is_answer", sa.Boolean(), nullable=False),
        sa.CheckConstraint("source IN ('loss', 'probe')", name=op.f("ck_action_records_source")),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_action_records_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint(
            "run_id", "step", "source", "traj_index", "action_index", name=op.f("pk_action_records")
        ),
    )
    blocks_to_records(op.get_bind(), _chunk_rows())
    op.drop_table("action_blocks")


def records_to_blocks(conn: sa.Connection, chunk_rows: int) -> None:
    """Every `action_records` row into `action_blocks`, one keyset page of at most `chunk_rows` rows
    (whole steps; a step larger than a page is read alone) at a time."""
    columns = [_records.c[name] for name in _RECORD_COLUMNS]
    order = [_records.c.step, _records.c.source, _records.c.traj_index, _records.c.action_index]
    run_ids = conn.execute(sa.select(_records.c.run_id).distinct().order_by(_records.c.run_id)).scalars()
    for run_id in list(run_ids):
        after: int | None = None
        while True:
            query = sa.select(*columns).where(_records.c.run_id == run_id)
            if after is not None:
                query = query.where(_records.c.step > after)
            page = _columns(conn.execute(query.order_by(*order).limit(chunk_rows)).all())
            if page is None:
                break
            steps = page["step"]
            full = len(steps) == chunk_rows
            if full:
                last = int(steps[-1])
                if int(steps[0]) == last:  # one step fills the page: read that step whole
                    one_step = query.where(_records.c.step == last).order_by(*order)
                    page = _columns(conn.execute(one_step).all())
                    assert page is not None
                else:  # the last step may continue on the next page: leave it to that page
                    cut = int(np.searchsorted(steps, last, side="left"))
                    page = {name: values[:cut] for name, values in page.items()}
            _insert_blocks(conn, run_id, page)
            after = int(page["step"][-1])
            if not full:
                break


def _columns(rows: Sequence[Any]) -> dict[str, np.ndarray] | None:
    if not rows:
        return None
    raw = dict(zip(_RECORD_COLUMNS, zip(*rows, strict=True), strict=True))
    out = {"step": np.asarray(raw["step"], dtype=np.int64), "source": np.asarray(raw["source"], dtype=object)}
    for name in ACTION_FIELDS:  # NULL floats -> NaN; booleans may come back as 0/1 (SQLite)
        dtype = np.float64 if name in FLOAT_FIELDS else bool if name == "is_answer" else np.int64
        out[name] = np.asarray(raw[name], dtype=dtype)
    return out


def _insert_blocks(conn: sa.Connection, run_id: int, page: dict[str, np.ndarray]) -> None:
    """Rows ordered by (step, source, traj_index, action_index) -> one block per (step, source)."""
    step, source = page["step"], page["source"]
    starts = np.flatnonzero(np.r_[True, (step[1:] != step[:-1]) | (source[1:] != source[:-1])])
    ends = np.r_[starts[1:], len(step)]
    rows = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        block = block_from_columns({name: page[name][a:b] for name in ACTION_FIELDS})
        rows.append(
            {
                "run_id": run_id,
                "step": int(step[a]),
                "source": str(source[a]),
                "n_records": len(block),
                "payload": encode_block(block),
                "summary": summarize(block),
            }
        )
    if rows:
        conn.execute(_blocks.insert(), rows)


def blocks_to_records(conn: sa.Connection, chunk_rows: int) -> None:
    """Every block with a payload back into `action_records` rows, about `chunk_rows` records at a time
    (whole steps of one run per page). Pruned blocks (payload NULL) have no records to restore."""
    has_payload = _blocks.c.payload.is_not(None)
    per_step = conn.execute(
        sa.select(_blocks.c.run_id, _blocks.c.step, sa.func.sum(_blocks.c.n_records))
        .where(has_payload)
        .group_by(_blocks.c.run_id, _blocks.c.step)
        .order_by(_blocks.c.run_id, _blocks.c.step)
    ).all()
    page: list[tuple[int, int]] = []  # (run_id, step) of the steps in the page
    size = 0
    for run_id, step, n in per_step:
        if page and (page[0][0] != run_id or size >= chunk_rows):
            _expand(conn, page[0][0], page[0][1], page[-1][1])
            page, size = [], 0
        page.append((int(run_id), int(step)))
        size += int(n)
    if page:
        _expand(conn, page[0][0], page[0][1], page[-1][1])


def _expand(conn: sa.Connection, run_id: int, step_lo: int, step_hi: int) -> None:
    payloads = conn.execute(
        sa.select(_blocks.c.step, _blocks.c.source, _blocks.c.payload)
        .where(
            _blocks.c.run_id == run_id,
            _blocks.c.step >= step_lo,
            _blocks.c.step <= step_hi,
            _blocks.c.payload.is_not(None),
        )
        .order_by(_blocks.c.step, _blocks.c.source)
    ).all()
    columns = concat_columns([(int(s), str(src), decode_block(p)) for s, src, p in payloads])
    out: dict[str, list[Any]] = {"run_id": [run_id] * len(columns["step"])}
    for name in _RECORD_COLUMNS:
        values = columns[name]
        if name in FLOAT_FIELDS:  # NaN was stored as NULL by the row store
            boxed = values.astype(object)
            boxed[np.isnan(values)] = None
            out[name] = boxed.tolist()
        else:
            out[name] = values.tolist()
    names = ["run_id", *_RECORD_COLUMNS]
    rows = list(zip(*(out[name] for name in names), strict=True))
    if not rows:
        return
    if conn.dialect.name == "postgresql":  # COPY: several times faster than an executemany INSERT
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur, cur.copy(f"COPY action_records ({', '.join(names)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return
    conn.exec_driver_sql(
        f"INSERT INTO action_records ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})", rows
    )
