"""Run-page panels: one load per panel (downsampled), then live refreshes that fetch only new steps.

Each panel has its own load callback (it queries only that panel's metrics, so the panels arrive in
parallel and a slow one holds up nothing) and its own cursor (a dcc.Store): the last step drawn,
which metrics it has traces for, the run's last step its bands reach, how many raw points refreshes
appended, and the signature of the phase events / alerts / directives drawn. One refresh callback
serves all panels: it queries `step_min = last + 1` once and answers with `dash.Patch` objects that
extend the traces in place and replace bands and markers. A panel is redrawn in full when one of its
metrics shows up for the first time, or once many raw points have been appended (downsampled again).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from dash import Dash, Input, Output, Patch, State, no_update

from dashboard import data
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from dashboard.figures import (
    Figure,
    band_shapes,
    empty_figure,
    marker_trace,
    markers_of,
    panel_figure,
    phase_bands,
    present_metrics,
)
from dashboard.panels import PANEL_METRICS, PANELS, Panel
from monitor.api.state import AppState
from monitor.domain import Principal, Series
from monitor.errors import LLDMonError

MAX_POINTS = 1500
"""Points per series of a full load (min/max buckets: spikes and NaN survive)."""
REBUILD_AFTER = 3000
"""Raw points appended per series by refreshes before a panel is reloaded downsampled."""

Cursor = dict[str, Any]
PanelOutput = Any
"""A figure dict (full), a dash.Patch (incremental) or dash.no_update."""


def last_step_of(series: Mapping[str, Series], default: int = -1) -> int:
    return max((s.steps[-1] for s in series.values() if s.steps), default=default)


def load_panel(
    state: AppState,
    principal: Principal,
    run_id: int,
    panel: Panel,
    *,
    rc: data.RunContext | None = None,
    max_points: int = MAX_POINTS,
) -> tuple[Figure, Cursor]:
    """One panel from the run's downsampled history of its metrics, with phase bands and markers."""
    rc = rc or data.run_context(state, principal, run_id)  # read first: `last` never skips a step
    series = data.series_map(state, principal, run_id, panel.metrics, max_points=max_points)
    band_end = rc.run.last_step
    figure = panel_figure(
        panel,
        series,
        phase_bands(rc.events, band_end),
        markers_of(rc.alerts, rc.directives, rc.events),
        uirevision=run_id,
    )
    cursor: Cursor = {
        "run_id": run_id,
        "last_step": max(last_step_of(series), -1 if band_end is None else band_end),
        "band_end": band_end,
        "present": present_metrics(panel, series),
        "appended": 0,
        "signature": rc.signature,
    }
    return figure, cursor


def load_panels(
    state: AppState, principal: Principal, run_id: int, *, max_points: int = MAX_POINTS
) -> tuple[list[Figure], list[Cursor]]:
    """Every panel (what the page's load callbacks do one by one)."""
    rc = data.run_context(state, principal, run_id)
    loaded = [load_panel(state, principal, run_id, p, rc=rc, max_points=max_points) for p in PANELS]
    return [f for f, _ in loaded], [c for _, c in loaded]


def _after(series: Series, step: int) -> Series:
    i = bisect.bisect_right(series.steps, step)
    return series if i == 0 else Series(series.name, series.steps[i:], series.values[i:])


def refresh_panels(
    state: AppState,
    principal: Principal,
    run_id: int,
    cursors: Sequence[Cursor | None],
    *,
    max_points: int = MAX_POINTS,
    rebuild_after: int = REBUILD_AFTER,
) -> tuple[list[PanelOutput], list[Cursor | Any]]:
    """Per panel: a Patch for the steps after its cursor, a full figure, or no_update (nothing changed)."""
    outputs: list[PanelOutput] = [no_update] * len(PANELS)
    new_cursors: list[Cursor | Any] = [no_update] * len(PANELS)
    live = [c for c in cursors if c and c.get("run_id") == run_id]
    if not live:
        return outputs, new_cursors  # no panel loaded yet
    rc = data.run_context(state, principal, run_id)
    step_min = min(int(c["last_step"]) for c in live) + 1
    new = data.series_map(state, principal, run_id, PANEL_METRICS, step_min=step_min)
    band_end = rc.run.last_step
    shapes: list[dict[str, Any]] | None = None
    markers: dict[str, Any] | None = None
    for i, (panel, cursor) in enumerate(zip(PANELS, cursors, strict=True)):
        if not cursor or cursor.get("run_id") != run_id:
            continue  # its load has not answered yet
        last = int(cursor["last_step"])
        arrived = {name: _after(new[name], last) for name in panel.metrics if name in new}
        arrived = {name: s for name, s in arrived.items() if s.steps}
        signature_changed = rc.signature != cursor["signature"]
        if not arrived and not signature_changed and band_end == cursor["band_end"]:
            continue
        had: list[str] = list(cursor["present"])
        appended = int(cursor["appended"]) + max((len(s.steps) for s in arrived.values()), default=0)
        if appended > rebuild_after or any(name not in had for name in arrived):
            # A metric shows up for the first time, or many raw points piled up: redraw the panel.
            outputs[i], new_cursors[i] = load_panel(
                state, principal, run_id, panel, rc=rc, max_points=max_points
            )
            continue
        if shapes is None:
            shapes = band_shapes(phase_bands(rc.events, band_end))
            markers = marker_trace(markers_of(rc.alerts, rc.directives, rc.events))
        patch = Patch()
        for name, s in arrived.items():
            trace = had.index(name)
            patch["data"][trace]["x"].extend(s.steps)
            patch["data"][trace]["y"].extend(s.values)
        patch["layout"]["shapes"] = shapes
        if signature_changed:
            patch["data"][len(had)] = markers
        outputs[i] = patch
        new_cursors[i] = {
            "run_id": run_id,
            "last_step": max(
                [last, -1 if band_end is None else band_end, *(s.steps[-1] for s in arrived.values())]
            ),
            "band_end": band_end,
            "present": had,
            "appended": appended,
            "signature": rc.signature,
        }
    return outputs, new_cursors


def register(app: Dash, ctx: DashContext) -> None:
    for panel in PANELS:
        _register_load(app, ctx, panel)

    @app.callback(
        *[Output(f"panel-{p.key}", "figure", allow_duplicate=True) for p in PANELS],
        *[Output(f"cursor-{p.key}", "data", allow_duplicate=True) for p in PANELS],
        Input("run-tick", "n_intervals"),
        State("run-id", "data"),
        *[State(f"cursor-{p.key}", "data") for p in PANELS],
        prevent_initial_call=True,
    )
    def _refresh(_tick: int | None, run_id: int, *cursors: Cursor | None) -> tuple[Any, ...]:
        try:
            outputs, new_cursors = refresh_panels(ctx.state, current_principal(), run_id, cursors)
        except LLDMonError:
            return tuple([no_update] * (2 * len(PANELS)))
        return (*outputs, *new_cursors)


def _register_load(app: Dash, ctx: DashContext, panel: Panel) -> None:
    @app.callback(
        Output(f"panel-{panel.key}", "figure"),
        Output(f"cursor-{panel.key}", "data"),
        Input("run-id", "data"),
    )
    def _load(run_id: int) -> tuple[Any, Any]:
        try:
            return load_panel(ctx.state, current_principal(), run_id, panel)
        except LLDMonError as exc:
            return empty_figure(error_text(exc), title=panel.title), None
