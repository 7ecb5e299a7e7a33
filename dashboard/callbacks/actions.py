"""Action-delta distribution: a histogram at the chosen step, and quantile bands over a window of steps.

The window is read newest chunk first under a row budget, so a run that logs many actions per step
gets a shorter window (said in the figure's title) instead of a slow page. The step box and the window
are clamped (`dashboard.inputs`): the work of one request is bounded whatever the browser sends.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output

from dashboard import inputs
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from dashboard.figures import Figure, action_step, delta_histogram, delta_quantiles, empty_figure
from monitor.api.state import AppState
from monitor.domain import Principal
from monitor.errors import LLDMonError

ROW_BUDGET = 25_000
"""Action records read for the quantile bands (~0.3 s on SQLite)."""
CHUNK_STEPS = 25
STEP_ROW_LIMIT = 50_000


def window_actions(
    state: AppState,
    principal: Principal,
    run_id: int,
    lo: int,
    hi: int,
    source: str | None,
    budget: int = ROW_BUDGET,
) -> tuple[dict[str, list[Any]], int]:
    """Action records of steps lo..hi, newest chunks first while within `budget` rows.

    Returns the columns (steps ascending) and the first step fully covered (> lo when the budget ran out).
    """
    chunks: list[dict[str, list[Any]]] = []
    total, first, size = 0, hi + 1, CHUNK_STEPS
    while hi >= lo and total < budget:
        chunk_lo = max(lo, hi - size + 1)
        part = state.query.actions(principal, run_id, chunk_lo, hi, source, budget - total + 1)
        if len(part["step"]) > budget - total:
            if chunk_lo == hi:
                break  # even one more step would overflow the budget
            size = max(1, size // 4)  # retry with fewer steps: never a partly read step
            continue
        chunks.append(part)
        total += len(part["step"])
        first = chunk_lo
        hi = chunk_lo - 1
    columns: dict[str, list[Any]] = {}
    for part in reversed(chunks):
        for name, values in part.items():
            columns.setdefault(name, []).extend(values)
    return columns or {"step": [], "delta": [], "advantage": []}, first


def action_figures(
    state: AppState,
    principal: Principal,
    run_id: object,
    step: object,
    window: object,
    source: object,
    *,
    budget: int = ROW_BUDGET,
) -> tuple[Figure, Figure]:
    """(histogram at `step` or the last earlier step with records, quantiles over the window up to it).

    The inputs are the callback's, unchecked: InvalidInput names a wrong one; the step is clamped into
    the step column's range and the window to at most `inputs.MAX_ACTION_WINDOW` steps."""
    rid = inputs.run_id(run_id)
    chosen_step, steps = inputs.action_step(step), inputs.action_window(window)
    src = inputs.action_source(source)
    if chosen_step is None:
        chosen_step = state.runs.get(principal, rid).last_step
    if chosen_step is None:
        empty = empty_figure("no steps logged yet")
        return empty, empty
    return _action_figures(state, principal, rid, chosen_step, steps, src, budget)


def _action_figures(
    state: AppState, principal: Principal, run_id: int, step: int, window: int, src: str | None, budget: int
) -> tuple[Figure, Figure]:
    lo = max(0, step - window + 1)
    window_rows, first = window_actions(state, principal, run_id, lo, step, src, budget)
    at_step = state.query.actions(principal, run_id, step, step, src, STEP_ROW_LIMIT)
    if not at_step["step"]:
        chosen = action_step(window_rows, step)
        if chosen is not None:
            at_step = state.query.actions(principal, run_id, chosen, chosen, src, STEP_ROW_LIMIT)
    quantiles = delta_quantiles(window_rows)
    if first > lo and window_rows["step"]:
        quantiles["layout"]["title"]["text"] += f" · steps {first}-{step} (row budget)"
    return delta_histogram(at_step, action_step(at_step, step)), quantiles


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("action-hist", "figure"),
        Output("action-quantiles", "figure"),
        Input("run-id", "data"),
        Input("action-step", "value"),
        Input("action-window", "value"),
        Input("action-source", "value"),
    )
    def _actions(run_id: object, step: object, window: object, source: object) -> tuple[Any, Any]:
        try:
            return action_figures(ctx.state, current_principal(), run_id, step, window, source)
        except LLDMonError as exc:
            fig = empty_figure(error_text(exc))
            return fig, fig
