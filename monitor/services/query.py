"""Read side: metric history (downsampled, JSON or CSV), action records, run summaries, events (directive
changes live in `DirectiveService`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from sqlalchemy import Connection

from contracts.action_pages import MAX_ACTION_READ, ActionCursor
from monitor.domain import (
    ActionSummaries,
    MetricSummary,
    PhaseEventInfo,
    Principal,
    RollbackInfo,
    RunContext,
    RunInfo,
    RunSummary,
    Series,
)
from monitor.errors import InvalidInput
from monitor.services.downsample import minmax_indices
from monitor.services.runs import RunService
from monitor.services.tables import history_csv
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
            drawn = _context(conn, run)
            return RunSummary(
                run=run,
                n_steps=n_steps,
                first_step=first_step,
                last_step=last_step,
                metrics=series_store.last_values(conn, run_id),
                phases=drawn.phases,
                alerts=drawn.alerts,
                directives=drawn.directives,
                directive=drawn.directive,
                rollbacks=drawn.rollbacks,
            )

    def context(self, principal: Principal, run_id: int) -> RunContext:
        """A run with its phase events, alerts and directives (one read transaction): what a page draws
        over the run's series."""
        run = self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return _context(conn, run)

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

    def rollbacks(self, principal: Principal, run_id: int) -> list[RollbackInfo]:
        self.runs.get(principal, run_id)
        with self.db.read() as conn:
            return event_store.list_rollbacks(conn, run_id)


def _context(conn: Connection, run: RunInfo) -> RunContext:
    """`run`'s phase events, alerts and directives, read on `conn`."""
    return RunContext(
        run=run,
        phases=event_store.list_phase_events(conn, run.id),
        alerts=alert_store.list_alerts(conn, run.id, None),
        directives=event_store.directive_history(conn, run.id),
        directive=event_store.current_directive(conn, run.id),
        rollbacks=event_store.list_rollbacks(conn, run.id),
    )


def downsample(series: Series, max_points: int) -> Series:
    keep = minmax_indices(np.asarray(series.values, dtype=np.float64), max_points)
    return Series(
        name=series.name,
        steps=[series.steps[i] for i in keep],
        values=[series.values[i] for i in keep],
    )
