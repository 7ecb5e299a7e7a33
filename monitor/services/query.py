"""Read side: metric history (downsampled, JSON or CSV), action records, run summaries, events (directive
changes live in `DirectiveService`)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from contracts.action_pages import MAX_ACTION_READ, ActionCursor
from contracts.wire import NAN, NEG_INF, POS_INF
from monitor.domain import ActionSummaries, MetricSummary, PhaseEventInfo, Principal, RunSummary, Series
from monitor.errors import InvalidInput
from monitor.services.downsample import minmax_indices
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import alerts as alert_store
from monitor.store import events as event_store
from monitor.store import series as series_store


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

    def history_csv(self, series: list[Series], nonfinite: Literal["wire", "python"] = "wire") -> str:
        """`history_csv` (module level: rendering needs no database)."""
        return history_csv(series, nonfinite)

    def summary(self, principal: Principal, run_id: int) -> RunSummary:
        """A run at a glance: extent, last values, phases, alerts, directives (one read transaction)."""
        run = self.runs.get(principal, run_id)
        with self.db.read() as conn:
            n_steps, first_step, last_step = series_store.step_extent(conn, run_id)
            return RunSummary(
                run=run,
                n_steps=n_steps,
                first_step=first_step,
                last_step=last_step,
                metrics=series_store.last_values(conn, run_id),
                phases=event_store.list_phase_events(conn, run_id),
                alerts=alert_store.list_alerts(conn, run_id, None),
                directives=event_store.directive_history(conn, run_id),
                directive=event_store.current_directive(conn, run_id),
            )

    def actions(
        self,
        principal: Principal,
        run_id: int,
        step_min: int | None,
        step_max: int | None,
        source: str | None,
        limit: int,
        after: ActionCursor | None = None,
    ) -> dict[str, list[Any]]:
        """At most `limit` (capped at MAX_ACTION_READ) records in key order; with `after`, those after
        that record's key (contracts.action_pages)."""
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return series_store.read_actions(
                conn, run_id, step_min, step_max, source, min(limit, MAX_ACTION_READ), after
            )

    def action_summaries(
        self,
        principal: Principal,
        run_id: int,
        step_min: int | None,
        step_max: int | None,
        source: str | None,
    ) -> ActionSummaries:
        """Per-step delta quantiles stored with the action blocks (also for pruned steps): a window of
        hundreds of steps without decoding a single record."""
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return series_store.read_action_summaries(conn, run_id, step_min, step_max, source)

    # The directive methods predate `DirectiveService` and delegate to it (the CLI and dashboard call them).

    def phase_events(self, principal: Principal, run_id: int) -> list[PhaseEventInfo]:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return event_store.list_phase_events(conn, run_id)


@dataclass(frozen=True)
class WideTable:
    """Series aligned on the union of their steps: the shape of every export.

    `values[i, j]` is metric j at `steps[i]`; where `logged[i, j]` is False the metric has no row at
    that step and the value is NaN only as a filler, unlike a NaN that was logged.
    """

    steps: np.ndarray  # (n_steps,) int64, ascending
    names: list[str]  # (n_metrics,)
    values: np.ndarray  # (n_steps, n_metrics) float64
    logged: np.ndarray  # (n_steps, n_metrics) bool


def wide_table(series: Sequence[Series]) -> WideTable:
    names = [s.name for s in series]
    if not series:
        return WideTable(np.empty(0, np.int64), names, np.empty((0, 0)), np.empty((0, 0), dtype=bool))
    steps = np.unique(np.concatenate([np.asarray(s.steps, dtype=np.int64) for s in series]))
    values = np.full((len(steps), len(series)), np.nan)
    logged = np.zeros((len(steps), len(series)), dtype=bool)
    for j, s in enumerate(series):
        rows = np.searchsorted(steps, np.asarray(s.steps, dtype=np.int64))
        values[rows, j] = np.asarray(s.values, dtype=np.float64)
        logged[rows, j] = True
    return WideTable(steps, names, values, logged)


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


def history_csv(series: list[Series], nonfinite: Literal["wire", "python"] = "wire") -> str:
    """Wide CSV: one row per step, one column per metric; empty cell = not logged.

    Non-finite values are written as the wire strings (`NaN`, `Infinity`, `-Infinity`, what the
    API's JSON uses) or, with nonfinite="python", as `nan`, `inf`, `-inf` (what `lldmon export`
    writes: float(), numpy and pandas read them back as floats). Built with numpy over the whole
    table (a 10,000-step run with 30 metrics is 300,000 cells).
    """
    header = ",".join(["step", *(_csv_quote(s.name) for s in series)])
    if not series:
        return header + "\n"
    table = wide_table(series)
    values = table.values
    text = values.astype(str).astype(object)  # numpy writes nan, inf, -inf
    if nonfinite == "wire":
        text[np.isnan(values)] = NAN
        text[values == np.inf] = POS_INF
        text[values == -np.inf] = NEG_INF
    text[~table.logged] = ""
    cells = np.column_stack([table.steps.astype(str).astype(object), text])
    return header + "\n" + "\n".join(",".join(row) for row in cells.tolist()) + "\n"
