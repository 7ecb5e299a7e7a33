"""Read side: metric history (downsampled, JSON or CSV), action records, directives, alerts, events."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from contracts.wire import encode_float
from monitor.domain import DirectiveInfo, MetricSummary, PhaseEventInfo, Principal, Series
from monitor.errors import InvalidInput
from monitor.services.downsample import minmax_indices
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import events as event_store
from monitor.store import series as series_store

MAX_ACTION_ROWS = 200_000


class QueryService:
    def __init__(self, db: Database, runs: RunService) -> None:
        self.db = db
        self.runs = runs

    def metric_names(self, principal: Principal, run_id: int) -> list[MetricSummary]:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return series_store.metric_names(conn, run_id)

    def history(
        self,
        principal: Principal,
        run_id: int,
        names: Sequence[str] | None,
        step_min: int | None = None,
        step_max: int | None = None,
        max_points: int | None = None,
    ) -> list[Series]:
        self.runs.get(principal, run_id)
        if step_min is not None and step_max is not None and step_min > step_max:
            raise InvalidInput("step_min must not exceed step_max", field="step_min")
        with self.db.read() as conn:
            series = series_store.read_series(conn, run_id, names or None, step_min, step_max)
        if max_points is not None:
            series = [downsample(s, max_points) for s in series]
        return series

    def history_csv(self, series: list[Series]) -> str:
        """Wide CSV: one row per step, one column per metric; empty cell = not logged."""
        by_step: dict[int, dict[str, float]] = {}
        for s in series:
            for step, value in zip(s.steps, s.values, strict=True):
                by_step.setdefault(step, {})[s.name] = value
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        names = [s.name for s in series]
        writer.writerow(["step", *names])
        for step in sorted(by_step):
            row = by_step[step]
            writer.writerow([step, *(_csv_cell(row.get(n)) for n in names)])
        return out.getvalue()

    def actions(
        self,
        principal: Principal,
        run_id: int,
        step_min: int | None,
        step_max: int | None,
        source: str | None,
        limit: int,
    ) -> dict[str, list[Any]]:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return series_store.read_actions(
                conn, run_id, step_min, step_max, source, min(limit, MAX_ACTION_ROWS)
            )

    def directive(self, principal: Principal, run_id: int) -> DirectiveInfo:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return event_store.current_directive(conn, run_id)

    def set_directive(
        self, principal: Principal, run_id: int, *, llds_enabled: bool, llds_lambda: float, reason: str
    ) -> DirectiveInfo:
        """Manual override by a user; recorded as a new directive version with its reason."""
        if not (llds_lambda >= 0 and np.isfinite(llds_lambda)):
            raise InvalidInput("lambda must be a finite number >= 0", field="lam")
        run = self.runs.get(principal, run_id)
        with self.db.write() as conn:
            event_store.append_directive(
                conn,
                run_id,
                llds_enabled=llds_enabled,
                llds_lambda=llds_lambda,
                reason=reason or "manual override",
                source="manual",
                step=run.last_step,
            )
            return event_store.current_directive(conn, run_id)

    def directive_history(self, principal: Principal, run_id: int) -> list[DirectiveInfo]:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return event_store.directive_history(conn, run_id)

    def phase_events(self, principal: Principal, run_id: int) -> list[PhaseEventInfo]:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return event_store.list_phase_events(conn, run_id)


def downsample(series: Series, max_points: int) -> Series:
    keep = minmax_indices(np.asarray(series.values, dtype=np.float64), max_points)
    return Series(
        name=series.name,
        steps=[series.steps[i] for i in keep],
        values=[series.values[i] for i in keep],
    )


def _csv_cell(value: float | None) -> str | float:
    if value is None:
        return ""
    return encode_float(value)
