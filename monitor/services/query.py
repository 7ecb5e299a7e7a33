"""Read side: metric history (downsampled, JSON or CSV), action records, directives, alerts, events."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from contracts.wire import NAN, NEG_INF, POS_INF
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
        """Wide CSV: one row per step, one column per metric; empty cell = not logged.

        Built column-wise with numpy (a 10,000-step run with 30 metrics is 300,000 cells).
        """
        header = ",".join(["step", *(_csv_quote(s.name) for s in series)])
        if not series:
            return header + "\n"
        all_steps = np.unique(np.concatenate([np.asarray(s.steps, dtype=np.int64) for s in series]))
        cells = np.full((len(all_steps), len(series) + 1), "", dtype=object)
        cells[:, 0] = all_steps.astype(str)
        for j, s in enumerate(series, start=1):
            values = np.asarray(s.values, dtype=np.float64)
            text = values.astype(str).astype(object)
            text[np.isnan(values)] = NAN
            text[values == np.inf] = POS_INF
            text[values == -np.inf] = NEG_INF
            cells[np.searchsorted(all_steps, np.asarray(s.steps, dtype=np.int64)), j] = text
        return header + "\n" + "\n".join(",".join(row) for row in cells.tolist()) + "\n"

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


def _csv_quote(name: str) -> str:
    """Metric names are free text: quote them the way the csv module would."""
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([name])
    return out.getvalue()
