"""Action-delta distribution: a histogram at the chosen step, and quantile bands over a window of steps.

The bands come from the per-step quantile summaries stored with each action block
(`state.query.action_summaries`), so a window of 500 steps costs about what 5 steps cost, whatever the
run logs per step, and steps whose raw records retention pruned still show. The histogram decodes the
one step it shows (`state.query.actions`); at a pruned step it says so instead of an empty plot. The
step box and the window are clamped (`dashboard.inputs`): the work of one request is bounded whatever
the browser sends.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from dash import Dash, Input, Output

from dashboard import inputs
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from dashboard.figures import (
    ACTION_HEIGHT,
    HISTOGRAM_TITLE,
    Figure,
    delta_histogram,
    empty_figure,
    figure_title,
    pruned_histogram,
    quantiles_title,
    summary_quantiles,
)
from monitor.domain import ActionSummaries, Principal
from monitor.errors import LLDMonError
from monitor.ports import DashboardPort

CHUNK_STEPS = 25
"""Steps per read of the former row-storage reader; a figure now reads the window's summaries once
and one step's records (kept as the bound the hardening test holds the reads to)."""
STEP_ROW_LIMIT = 50_000
"""Records decoded for the histogram of one step."""


def action_figures(
    state: DashboardPort,
    principal: Principal,
    run_id: object,
    step: object,
    window: object,
    source: object,
    *,
    budget: int | None = None,
) -> tuple[Figure, Figure]:
    """(histogram at `step` or the last earlier step with records, quantiles over the window up to it).

    The inputs are the callback's, unchecked: InvalidInput names a wrong one; the step is clamped into
    the step column's range and the window to at most `inputs.MAX_ACTION_WINDOW` steps. `budget` (off
    by default: the bands no longer read raw records) keeps only the newest steps whose records add up
    to at most that many, and says so in the title."""
    rid = inputs.run_id(run_id)
    chosen_step, steps = inputs.action_step(step), inputs.action_window(window)
    src = inputs.action_source(source)
    if chosen_step is None:
        chosen_step = state.runs.get(principal, rid).last_step
    if chosen_step is None:
        return _placeholders("no steps logged yet")
    return _action_figures(state, principal, rid, chosen_step, steps, src, budget)


def _action_figures(
    state: DashboardPort,
    principal: Principal,
    run_id: int,
    step: int,
    window: int,
    src: str | None,
    budget: int | None,
) -> tuple[Figure, Figure]:
    lo = max(0, step - window + 1)
    summaries = state.query.action_summaries(principal, run_id, lo, step, src)
    first = _budget_start(summaries, budget) if budget is not None else lo
    quantiles = summary_quantiles(_from_step(summaries, first) if first > lo else summaries)
    if first > lo and summaries.steps:
        quantiles["layout"]["meta"]["title"] += f" · steps {first}-{step} (row budget)"
    return _histogram(state, principal, run_id, summaries, src), quantiles


def _placeholders(message: str) -> tuple[Figure, Figure]:
    """(histogram, quantiles) that say `message` under their usual titles."""
    return (
        empty_figure(message, height=ACTION_HEIGHT, title=HISTOGRAM_TITLE),
        empty_figure(message, height=ACTION_HEIGHT, title=quantiles_title()),
    )


def _histogram(
    state: DashboardPort, principal: Principal, run_id: int, summaries: ActionSummaries, src: str | None
) -> Figure:
    """The last step of the window that has action blocks: its records, or why they are gone."""
    if not summaries.steps:
        return delta_histogram({"step": []}, None)
    steps = np.asarray(summaries.steps, dtype=np.int64)
    shown = int(steps.max())
    records = state.query.actions(principal, run_id, shown, shown, src, STEP_ROW_LIMIT)
    if not records["step"] and np.asarray(summaries.pruned, dtype=bool)[steps == shown].any():
        return pruned_histogram(shown)
    return delta_histogram(records, shown)


def _budget_start(summaries: ActionSummaries, budget: int) -> int:
    """The first step of the newest steps whose records (n_all) add up to at most `budget`."""
    steps = np.asarray(summaries.steps, dtype=np.int64)
    if not steps.size:
        return 0
    unique, where = np.unique(steps, return_inverse=True)
    per_step = np.bincount(where, weights=np.asarray(summaries.n_all, dtype=np.float64))
    newest_first = np.cumsum(per_step[::-1])
    fits = int(np.searchsorted(newest_first, budget, side="right"))  # steps that fit, newest first
    return int(unique[-fits]) if fits else int(unique[-1]) + 1


def _from_step(summaries: ActionSummaries, first: int) -> ActionSummaries:
    keep = np.flatnonzero(np.asarray(summaries.steps, dtype=np.int64) >= first).tolist()
    return ActionSummaries(
        steps=[summaries.steps[i] for i in keep],
        sources=[summaries.sources[i] for i in keep],
        levels=summaries.levels,
        n_all=[summaries.n_all[i] for i in keep],
        q_all=[summaries.q_all[i] for i in keep],
        n_pos=[summaries.n_pos[i] for i in keep],
        q_pos=[summaries.q_pos[i] for i in keep],
        pruned=[summaries.pruned[i] for i in keep],
    )


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("action-hist", "figure"),
        Output("action-quantiles", "figure"),
        Output("action-hist-title", "children"),
        Output("action-quantiles-title", "children"),
        Input("run-id", "data"),
        Input("action-step", "value"),
        Input("action-window", "value"),
        Input("action-source", "value"),
    )
    def _actions(run_id: object, step: object, window: object, source: object) -> tuple[Any, ...]:
        try:
            hist, quantiles = action_figures(ctx.state, current_principal(), run_id, step, window, source)
        except LLDMonError as exc:
            hist, quantiles = _placeholders(error_text(exc))
        return hist, quantiles, figure_title(hist), figure_title(quantiles)
