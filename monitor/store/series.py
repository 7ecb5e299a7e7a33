"""Reads of metric history and action records, served by the (run_id, name, step) primary key."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, and_, func, select

from monitor.db.models import ActionRecord, StepMetric
from monitor.domain import MetricLast, MetricSummary, Series
from monitor.store._sql import table_of

step_metrics = table_of(StepMetric)
action_records = table_of(ActionRecord)


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
    conn: Connection, run_id: int, step_min: int | None, step_max: int | None, source: str | None, limit: int
) -> dict[str, list[Any]]:
    """Action records as columns (the wire format's shape), ordered by step, source, trajectory, action."""
    cols = [action_records.c[name] for name in _ACTION_READ_COLUMNS]
    query = select(*cols).where(action_records.c.run_id == run_id)
    if step_min is not None:
        query = query.where(action_records.c.step >= step_min)
    if step_max is not None:
        query = query.where(action_records.c.step <= step_max)
    if source is not None:
        query = query.where(action_records.c.source == source)
    query = query.order_by(
        action_records.c.step,
        action_records.c.source,
        action_records.c.traj_index,
        action_records.c.action_index,
    ).limit(limit)
    out: dict[str, list[Any]] = {name: [] for name in _ACTION_READ_COLUMNS}
    for row in conn.execute(query):
        for name, value in zip(_ACTION_READ_COLUMNS, row, strict=True):
            if name in _FLOAT_COLUMNS and value is None:
                value = math.nan
            out[name].append(value)
    return out


_ACTION_READ_COLUMNS = (
    "step",
    "traj_index",
    "action_index",
    "n_tokens",
    "delta",
    "old_logp_mean",
    "advantage",
    "reward",
    "is_answer",
    "source",
)
_FLOAT_COLUMNS = frozenset({"delta", "old_logp_mean", "advantage", "reward"})
