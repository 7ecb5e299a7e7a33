"""Reads of metric history (served by the (run_id, name, step) primary key) and of action records
(blocks served by the (run_id, step, source) primary key, decoded with numpy)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, and_, func, select
from sqlalchemy.sql.elements import ColumnElement

from contracts.action_pages import ActionCursor
from contracts.wire import ACTION_COLUMNS
from monitor.db.models import ActionBlock, StepMetric
from monitor.domain import ActionSummaries, MetricLast, MetricSummary, Series
from monitor.store._sql import table_of
from monitor.store.action_codec import (
    SUMMARY_LEVELS,
    Block,
    concat_columns,
    decode_block,
    empty_block,
    records_after,
)

step_metrics = table_of(StepMetric)
action_blocks = table_of(ActionBlock)


def metric_names(conn: Connection, run_id: int) -> list[MetricSummary]:
    rows = conn.execute(
        select(
            step_metrics.c.name,
            func.count(),
            func.min(step_metrics.c.step),
            func.max(step_metrics.c.step),
        )
        .where(step_metrics.c.run_id == run_id)
        .group_by(step_metrics.c.name)
        .order_by(step_metrics.c.name)
    ).all()
    return [MetricSummary(str(n), int(c), int(lo), int(hi)) for n, c, lo, hi in rows]


def last_values(conn: Connection, run_id: int) -> list[MetricLast]:
    """Per metric: point count, step range and the value at its last step (stored NULL -> NaN)."""
    extent = (
        select(
            step_metrics.c.name,
            func.count().label("points"),
            func.min(step_metrics.c.step).label("first_step"),
            func.max(step_metrics.c.step).label("last_step"),
        )
        .where(step_metrics.c.run_id == run_id)
        .group_by(step_metrics.c.name)
        .subquery()
    )
    rows = conn.execute(
        select(extent, step_metrics.c.value)
        .join(
            step_metrics,
            and_(
                step_metrics.c.run_id == run_id,
                step_metrics.c.name == extent.c.name,
                step_metrics.c.step == extent.c.last_step,
            ),
        )
        .order_by(extent.c.name)
    ).all()
    return [
        MetricLast(str(n), int(c), int(lo), int(hi), math.nan if v is None else float(v))
        for n, c, lo, hi, v in rows
    ]


def step_extent(conn: Connection, run_id: int) -> tuple[int, int | None, int | None]:
    """(distinct steps with at least one metric, first step, last step) of a run."""
    count, lo, hi = conn.execute(
        select(
            func.count(step_metrics.c.step.distinct()),
            func.min(step_metrics.c.step),
            func.max(step_metrics.c.step),
        ).where(step_metrics.c.run_id == run_id)
    ).one()
    return int(count), None if lo is None else int(lo), None if hi is None else int(hi)


def read_series(
    conn: Connection,
    run_id: int,
    names: Sequence[str] | None,
    step_min: int | None = None,
    step_max: int | None = None,
) -> list[Series]:
    """Series of the given names (all if None), steps ascending; stored NULL is returned as NaN."""
    query = select(step_metrics.c.name, step_metrics.c.step, step_metrics.c.value).where(
        step_metrics.c.run_id == run_id
    )
    if names is not None:
        query = query.where(step_metrics.c.name.in_(list(names)))
    if step_min is not None:
        query = query.where(step_metrics.c.step >= step_min)
    if step_max is not None:
        query = query.where(step_metrics.c.step <= step_max)
    query = query.order_by(step_metrics.c.name, step_metrics.c.step)
    return _group(conn.execute(query))


def _group(rows: Iterable[Any]) -> list[Series]:
    """Rows ordered by (name, step) -> one Series per name, without per-row Python objects."""
    columns = list(zip(*rows, strict=True))
    if not columns:
        return []
    names, steps, values = columns
    step_arr = np.fromiter(steps, dtype=np.int64, count=len(steps))
    value_arr = np.fromiter(
        (math.nan if v is None else v for v in values), dtype=np.float64, count=len(values)
    )
    name_arr = np.asarray(names, dtype=object)
    starts = [0, *(np.flatnonzero(name_arr[1:] != name_arr[:-1]) + 1).tolist()]
    ends = [*starts[1:], len(names)]
    return [
        Series(name=names[a], steps=step_arr[a:b].tolist(), values=value_arr[a:b].tolist())
        for a, b in zip(starts, ends, strict=True)
    ]


def read_actions(
    conn: Connection,
    run_id: int,
    step_min: int | None,
    step_max: int | None,
    source: str | None,
    limit: int,
    after: ActionCursor | None = None,
) -> dict[str, list[Any]]:
    """Action records as columns (the wire format's shape), ordered by step, source, trajectory, action,
    at most `limit`; with `after`, only the records whose key is greater than it (the next page of a
    step read in parts). Only the blocks that hold those records are fetched and decoded (their record
    counts are read first; the block `after` points into is decoded first, to count what is left of
    it); pruned blocks hold no records."""
    kept = _action_filter(run_id, step_min, step_max, source) & action_blocks.c.payload.is_not(None)
    if after is not None:
        kept &= (action_blocks.c.step > after.step) | (
            (action_blocks.c.step == after.step) & (action_blocks.c.source >= after.source)
        )
    extent = conn.execute(
        select(action_blocks.c.step, action_blocks.c.source, action_blocks.c.n_records)
        .where(kept)
        .order_by(action_blocks.c.step, action_blocks.c.source)
        .limit(max(limit, 0) + 1)  # every stored block holds a record; the first may hold none after `after`
    ).all()
    keys = [(int(step), str(src)) for step, src, _ in extent]
    counts = np.fromiter((n for _, _, n in extent), dtype=np.int64, count=len(extent))
    decoded: dict[tuple[int, str], Block] = {}
    if after is not None and keys and keys[0] == (after.step, after.source):
        first = _decode_blocks(conn, run_id, kept, keys[:1]).get(keys[0], empty_block())  # gone: none
        decoded[keys[0]] = records_after(first, after.traj_index, after.action_index)
        counts[0] = len(decoded[keys[0]])
    needed = keys[: int(np.searchsorted(np.cumsum(counts), limit, side="left")) + 1] if limit > 0 else []
    decoded |= _decode_blocks(conn, run_id, kept, [key for key in needed if key not in decoded])
    columns = concat_columns(
        [(step, src, decoded[step, src]) for step, src in needed if (step, src) in decoded]
    )
    return {name: columns[name][: max(limit, 0)].tolist() for name in _ACTION_READ_COLUMNS}


def _decode_blocks(
    conn: Connection, run_id: int, kept: ColumnElement[bool], keys: Sequence[tuple[int, str]]
) -> dict[tuple[int, str], Block]:
    """The blocks of `keys` (in key order, all matching `kept`), decoded; one query over their step range."""
    if not keys:
        return {}
    wanted = set(keys)
    rows = conn.execute(
        select(action_blocks.c.step, action_blocks.c.source, action_blocks.c.payload)
        .where(kept, action_blocks.c.step >= keys[0][0], action_blocks.c.step <= keys[-1][0])
        .order_by(action_blocks.c.step, action_blocks.c.source)
    )
    return {
        (int(step), str(src)): decode_block(payload)
        for step, src, payload in rows
        if (int(step), str(src)) in wanted
    }


def read_action_summaries(
    conn: Connection, run_id: int, step_min: int | None, step_max: int | None, source: str | None
) -> ActionSummaries:
    """The per-step delta quantiles stored with each block (pruned ones included), ordered by step and
    source; no payload is read."""
    rows = conn.execute(
        select(
            action_blocks.c.step,
            action_blocks.c.source,
            action_blocks.c.summary,
            action_blocks.c.payload.is_(None),
        )
        .where(_action_filter(run_id, step_min, step_max, source))
        .order_by(action_blocks.c.step, action_blocks.c.source)
    ).all()
    n_all: list[int] = []
    q_all: list[list[float]] = []
    n_pos: list[int] = []
    q_pos: list[list[float]] = []
    for _, _, summary, _ in rows:
        for part, ns, qs in (("all", n_all, q_all), ("pos", n_pos, q_pos)):
            ns.append(int(summary[part]["n"]))
            qs.append(_at_levels(summary["levels"], summary[part]["q"]))
    return ActionSummaries(
        steps=[int(r[0]) for r in rows],
        sources=[str(r[1]) for r in rows],
        levels=SUMMARY_LEVELS,
        n_all=n_all,
        q_all=q_all,
        n_pos=n_pos,
        q_pos=q_pos,
        pruned=[bool(r[3]) for r in rows],
    )


def _at_levels(levels: Sequence[float], quantiles: Sequence[float | None]) -> list[float]:
    """Stored quantiles (None -> NaN) at SUMMARY_LEVELS; a summary stored at other levels (an older
    lldmon) is interpolated between them, NaN outside their range."""
    q = [math.nan if v is None else float(v) for v in quantiles]
    if tuple(levels) == SUMMARY_LEVELS:
        return q
    return np.interp(SUMMARY_LEVELS, levels, q, left=math.nan, right=math.nan).tolist()


def _action_filter(
    run_id: int, step_min: int | None, step_max: int | None, source: str | None
) -> ColumnElement[bool]:
    condition = action_blocks.c.run_id == run_id
    if step_min is not None:
        condition &= action_blocks.c.step >= step_min
    if step_max is not None:
        condition &= action_blocks.c.step <= step_max
    if source is not None:
        condition &= action_blocks.c.source == source
    return condition


_ACTION_READ_COLUMNS = ACTION_COLUMNS
