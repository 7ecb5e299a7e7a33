"""action blocks (issue 17): a step's action records as one encoded row per (run, step, source)

`action_records` (one row per record, about 161 bytes each on PostgreSQL) becomes `action_blocks`: the
records of one (run, step, source) encoded in the action block format (about 10 bytes a record),
with the record count and a per-step quantile summary that survive retention pruning (payload NULL).
Keyed by run first, like every large table, so it can be hash-partitioned by run_id.

Upgrading converts every record, run by run, a bounded number of records at a time (keyset pages on
the primary key, grouped with numpy): a large table never has to fit in memory. Downgrading recreates
`action_records` exactly as revision 0001 made it and expands the blocks back into rows (NaN as NULL,
as the old store wrote it); blocks already pruned by retention have no records left to restore, only
their summary, which is dropped.

The conversion encodes and decodes with a frozen copy of `monitor.store.action_codec` (format version
1, the functions this revision calls, as they were when it was written) kept in this file on purpose:
a migration must keep doing what it did, so it imports no live code whose behaviour may change. The
live codec keeps reading version 1, so the blocks written here stay readable. The page size is
`config.attributes["lldmon.migration_chunk_rows"]` (tests make it tiny to cross page boundaries).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# --- frozen action block codec ---------------------------------------------------------------------
# A copy of `monitor.store.action_codec` (format version 1) as it was when this revision was written,
# trimmed to what the revision calls. Frozen on purpose: a later change to the live codec must not
# change what this migration writes or reads. Do not edit it to follow the codec.

ACTION_FIELDS = (
    "traj_index",
    "action_index",
    "n_tokens",
    "delta",
    "old_logp_mean",
    "advantage",
    "reward",
    "is_answer",
)
SUMMARY_LEVELS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9)
INT_FIELDS = ("traj_index", "action_index", "n_tokens")
FLOAT_FIELDS = ("delta", "old_logp_mean", "advantage", "reward")

MAGIC = b"LLDA"
VERSION = 1
_HEADER = struct.Struct(f"<4sBI{len(ACTION_FIELDS)}B")
_ZLIB_LEVEL = 1

_BITS = 11
_CODES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<i8"),
    5: np.dtype("<u1"),
    6: np.dtype("<u2"),
    7: np.dtype("<u4"),
    8: np.dtype("<u8"),
    9: np.dtype("<f4"),
    10: np.dtype("<f8"),
}
_CODE_OF = {dtype: code for code, dtype in _CODES.items()}
_ALLOWED = {
    "traj_index": {5, 6, 7, 8},
    "action_index": {1, 2, 3, 4},
    "n_tokens": {1, 2, 3, 4},
    "delta": {9, 10},
    "old_logp_mean": {9, 10},
    "advantage": {9, 10},
    "reward": {9, 10},
    "is_answer": {_BITS},
}
_SIGNED = (np.dtype("<i1"), np.dtype("<i2"), np.dtype("<i4"), np.dtype("<i8"))
_UNSIGNED = (np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8"))


@dataclass(frozen=True)
class Block:
    """The records of one (run, step, source): equal-length arrays sorted by (traj_index,
    action_index) with unique keys. Missing floats are NaN, +-inf are kept."""

    traj_index: np.ndarray  # int64
    action_index: np.ndarray  # int64
    n_tokens: np.ndarray  # int64
    delta: np.ndarray  # float64
    old_logp_mean: np.ndarray  # float64
    advantage: np.ndarray  # float64
    reward: np.ndarray  # float64
    is_answer: np.ndarray  # bool

    def __post_init__(self) -> None:
        n = len(self.traj_index)
        if any(len(getattr(self, f.name)) != n for f in fields(self)):
            raise ValueError("action block columns must have equal lengths")

    def __len__(self) -> int:
        return len(self.traj_index)


def empty_block() -> Block:
    return _block(
        np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), *_floats(0), np.empty(0, bool)
    )


def block_from_columns(columns: Mapping[str, Sequence[Any] | np.ndarray]) -> Block:
    """A block from columns keyed by ACTION_FIELDS (other keys ignored): None -> NaN, sorted by key,
    and of records listed twice the later one wins (as for a re-sent record)."""
    try:
        ints = [np.asarray(columns[name], dtype=np.int64) for name in INT_FIELDS]
        floats = [np.asarray(columns[name], dtype=np.float64) for name in FLOAT_FIELDS]
        is_answer = np.asarray(columns["is_answer"], dtype=bool)
    except KeyError as exc:
        raise ValueError(f"action columns lack {exc.args[0]!r}") from None
    return _canonical(_block(*ints, *floats, is_answer))


def encode_block(block: Block) -> bytes:
    n = len(block)
    if n >= 2**32:
        raise ValueError(f"an action block holds at most 2**32 - 1 records, got {n}")
    codes: list[int] = []
    parts: list[bytes] = []
    for name in ACTION_FIELDS:
        values = getattr(block, name)
        if name == "is_answer":
            codes.append(_BITS)
            parts.append(np.packbits(values.astype(bool, copy=False), bitorder="little").tobytes())
            continue
        if name == "traj_index":
            raw = values.astype(np.int64, copy=False).view(np.uint64)
            stored = np.diff(raw, prepend=np.uint64(0))  # wraps modulo 2**64, exact both ways
            stored = stored.astype(_smallest(stored, _UNSIGNED), copy=False)
        elif name in INT_FIELDS:
            stored = values.astype(_smallest(values, _SIGNED), copy=False)
        else:
            stored = _narrow_float(values)
        codes.append(_CODE_OF[stored.dtype])
        parts.append(_shuffle(stored))
    header = _HEADER.pack(MAGIC, VERSION, n, *codes)
    return header + zlib.compress(b"".join(parts), _ZLIB_LEVEL)


def decode_block(payload: bytes) -> Block:
    """The block of an `encode_block` payload; ValueError naming the problem if it is not one."""
    payload = bytes(payload)  # memoryview from some drivers
    if len(payload) < _HEADER.size:
        raise ValueError(f"action block payload too short ({len(payload)} bytes) for its header")
    magic, version, n, *codes = _HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise ValueError(f"not an action block payload (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"unknown action block version {version} (this lldmon reads {VERSION})")
    sizes: list[int] = []
    dtypes: list[np.dtype[Any] | None] = []
    for name, code in zip(ACTION_FIELDS, codes, strict=True):
        if code not in _ALLOWED[name]:
            raise ValueError(f"corrupt action block: column {name!r} has invalid type code {code}")
        dtype = _CODES.get(code)
        dtypes.append(dtype)
        sizes.append((n + 7) // 8 if dtype is None else n * dtype.itemsize)
    expected = sum(sizes)
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(payload[_HEADER.size :], expected + 1)
    except zlib.error as exc:
        raise ValueError(f"corrupt action block: compressed body does not inflate ({exc})") from None
    if len(body) != expected or not inflater.eof or inflater.unused_data or inflater.unconsumed_tail:
        raise ValueError(
            f"corrupt action block: body holds {len(body)} bytes"
            f"{'' if inflater.eof else ' (truncated)'}, header announces {n} records ({expected} bytes)"
        )
    columns: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype, size in zip(ACTION_FIELDS, dtypes, sizes, strict=True):
        chunk = body[offset : offset + size]
        offset += size
        if dtype is None:
            columns[name] = np.unpackbits(np.frombuffer(chunk, np.uint8), count=n, bitorder="little").astype(
                bool
            )
            continue
        stored = _unshuffle(chunk, dtype, n)
        if name == "traj_index":
            columns[name] = np.cumsum(stored.astype(np.uint64), dtype=np.uint64).view(np.int64)
        elif name in INT_FIELDS:
            columns[name] = stored.astype(np.int64)
        else:
            columns[name] = stored.astype(np.float64)
    block = _block(*(columns[name] for name in ACTION_FIELDS))
    if n > 1:
        t, a = block.traj_index, block.action_index
        if not np.all((t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (a[1:] > a[:-1]))):
            raise ValueError(
                "corrupt action block: records are not sorted by unique (traj_index, action_index)"
            )
    return block


def summarize(block: Block) -> dict[str, Any]:
    """JSON-able per-step summary kept after pruning: quantiles (numpy's linear method, pandas'
    default) of the finite deltas of all records and of the records with advantage > 0."""
    finite = np.isfinite(block.delta)
    positive = finite & (block.advantage > 0)
    return {
        "levels": list(SUMMARY_LEVELS),
        "all": _quantiles(block.delta[finite]),
        "pos": _quantiles(block.delta[positive]),
    }


def concat_columns(blocks: Sequence[tuple[int, str, Block]]) -> dict[str, np.ndarray]:
    """The records of several blocks as columns `step`, `source` and ACTION_FIELDS, block after block."""
    sizes = np.asarray([len(block) for _, _, block in blocks], dtype=np.int64)
    out: dict[str, np.ndarray] = {
        "step": np.repeat(np.asarray([step for step, _, _ in blocks], dtype=np.int64), sizes),
        "source": np.repeat(np.asarray([source for _, source, _ in blocks], dtype=object), sizes),
    }
    empty = empty_block()
    for name in ACTION_FIELDS:
        parts = [getattr(block, name) for _, _, block in blocks]
        out[name] = np.concatenate(parts) if parts else getattr(empty, name)
    return out


def _block(*columns: np.ndarray) -> Block:
    return Block(**dict(zip(ACTION_FIELDS, columns, strict=True)))


def _floats(n: int) -> list[np.ndarray]:
    return [np.empty(n, np.float64) for _ in FLOAT_FIELDS]


def _canonical(block: Block) -> Block:
    """Sorted by (traj_index, action_index); of equal keys the last one (stable sort) is kept."""
    t, a = block.traj_index, block.action_index
    n = len(t)
    if n == 0:
        return block
    if n > 1 and np.all((t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (a[1:] > a[:-1]))):
        return block  # already canonical (the usual case: the hooks send records in order)
    order = np.lexsort((a, t))
    ts, as_ = t[order], a[order]
    keep = np.ones(n, dtype=bool)
    keep[:-1] = (ts[1:] != ts[:-1]) | (as_[1:] != as_[:-1])
    index = order[keep]
    return _block(*(getattr(block, name)[index] for name in ACTION_FIELDS))


def _smallest(values: np.ndarray, candidates: tuple[np.dtype[Any], ...]) -> np.dtype[Any]:
    if len(values) == 0:
        return candidates[0]
    lo, hi = values.min(), values.max()
    for dtype in candidates:
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    return candidates[-1]


def _narrow_float(values: np.ndarray) -> np.ndarray:
    """float32 if that is exact for every value (NaN counts as exact), else float64."""
    values = values.astype("<f8", copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = values.astype("<f4")
    same = (narrow.astype("<f8") == values) | (np.isnan(values) & np.isnan(narrow))
    return narrow if bool(np.all(same)) else values


def _shuffle(values: np.ndarray) -> bytes:
    values = np.ascontiguousarray(values)
    if values.dtype.itemsize == 1:
        return values.tobytes()
    return values.view(np.uint8).reshape(len(values), values.dtype.itemsize).T.tobytes()


def _unshuffle(chunk: bytes, dtype: np.dtype[Any], n: int) -> np.ndarray:
    raw = np.frombuffer(chunk, np.uint8)
    if dtype.itemsize == 1:
        return raw.view(dtype).copy()
    return np.ascontiguousarray(raw.reshape(dtype.itemsize, n).T).view(dtype).reshape(n)


def _quantiles(values: np.ndarray) -> dict[str, Any]:
    n = len(values)
    if n == 0:
        return {"n": 0, "q": [None] * len(SUMMARY_LEVELS)}
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.quantile(values, SUMMARY_LEVELS)
    if not np.all(np.isfinite(q)):  # b - a overflowed (values near +-1.8e308): the convex form cannot
        ordered = np.sort(values)
        position = np.asarray(SUMMARY_LEVELS) * (n - 1)
        lo = np.floor(position).astype(np.int64)
        t = position - lo
        q = ordered[lo] * (1 - t) + ordered[np.minimum(lo + 1, n - 1)] * t
    return {"n": n, "q": [float(v) for v in q]}


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
