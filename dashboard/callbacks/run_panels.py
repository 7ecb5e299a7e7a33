"""Run-page panels: one load per panel (downsampled), then live refreshes that fetch only new steps.

What every panel draws over its series (phase bands, alert and directive markers) is the run's context,
read once when the page is built (`overlay_of`, kept in the page's `run-overlay` store) and once per
refresh, never once per panel. Each panel has its own load callback (it queries only that panel's
metrics, so the panels arrive in parallel and a slow one holds up nothing) and its own cursor (a dcc.Store): the last step drawn,
which metrics it has traces for, the run's last step its bands reach, how many raw points refreshes
appended, and the signature of the phase events / alerts / directives drawn. One refresh callback
serves all panels: it queries `step_min = last + 1` once and answers with `dash.Patch` objects that
extend the traces in place and replace bands and markers. A panel is redrawn in full when one of its
metrics shows up for the first time, or once many raw points have been appended (downsampled again).

Cursors and the overlay come back from the browser: a cursor that is not what `load_panel` made
(crafted, or from another run) is ignored, an overlay that is not what `overlay_of` made is read again
from the service, and a run whose last step is the largest BIGINT has no step after it to query.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dash import Dash, Input, Output, Patch, State, no_update

from dashboard import data, inputs
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext, error_text
from dashboard.figures import (
    Figure,
    band_shapes,
    empty_figure,
    log_dtick,
    log_range,
    marker_trace,
    markers_of,
    panel_figure,
    phase_bands,
    present_metrics,
)
from dashboard.panels import PANEL_METRICS, PANELS, Panel
from monitor.domain import Principal, RunContext, Series
from monitor.errors import LLDMonError
from monitor.ports import DashboardPort

MAX_POINTS = 1500
"""Points per series of a full load (min/max buckets: spikes and NaN survive)."""
REBUILD_AFTER = 3000
"""Raw points appended per series by refreshes before a panel is reloaded downsampled."""

Cursor = dict[str, Any]
Overlay = dict[str, Any]
"""What every panel of a run page draws over its series, as JSON (`overlay_of`)."""
PanelOutput = Any
"""A figure dict (full), a dash.Patch (incremental) or dash.no_update."""


def last_step_of(series: Mapping[str, Series], default: int = -1) -> int:
    return max((s.steps[-1] for s in series.values() if s.steps), default=default)


def overlay_of(rc: RunContext) -> Overlay:
    """The phase bands and markers every panel draws, with the step the bands reach and the signature
    of what they were drawn from."""
    band_end = rc.run.last_step
    return {
        "run_id": rc.run.id,
        "band_end": band_end,
        "signature": data.signature(rc),
        "shapes": band_shapes(phase_bands(rc.phases, band_end)),
        "markers": marker_trace(markers_of(rc.alerts, rc.directives, rc.phases, rc.rollbacks)),
        "rollbacks": len(rc.rollbacks),
    }


def valid_overlay(overlay: object, run_id: int) -> Overlay | None:
    """`overlay` if it has the shape `overlay_of` gives for this run, else None."""
    if not isinstance(overlay, dict) or overlay.get("run_id") != run_id:
        return None
    band_end, shapes, markers = overlay.get("band_end"), overlay.get("shapes"), overlay.get("markers")
    if not (
        (band_end is None or _is_step(band_end, 0))
        and isinstance(overlay.get("signature"), str)
        and isinstance(shapes, list)
        and all(isinstance(shape, dict) for shape in shapes)
        and isinstance(markers, dict)
        and _is_step(overlay.get("rollbacks"), 0)
    ):
        return None
    return overlay


def load_panel(
    state: DashboardPort,
    principal: Principal,
    run_id: object,
    panel: Panel,
    overlay: Overlay,
    *,
    max_points: int = MAX_POINTS,
) -> tuple[Figure, Cursor]:
    """One panel from the run's downsampled history of its metrics, under the page's `overlay` (read
    before the series, so the bands never reach past the data a later refresh starts from)."""
    run_id = inputs.run_id(run_id)
    series = data.series_map(state, principal, run_id, panel.metrics, max_points=max_points)
    band_end = overlay["band_end"]
    figure = panel_figure(panel, series, overlay["shapes"], overlay["markers"], uirevision=run_id)
    cursor: Cursor = {
        "run_id": run_id,
        "last_step": max(last_step_of(series), -1 if band_end is None else band_end),
        "band_end": band_end,
        "present": present_metrics(panel, series),
        "appended": 0,
        "signature": overlay["signature"],
        "log_range": _log_range(panel, series.values()),
        "rollbacks": overlay["rollbacks"],
    }
    return figure, cursor


def panel_load(
    state: DashboardPort, principal: Principal, run_id: object, panel: Panel, overlay: object = None
) -> tuple[Figure, Any]:
    """What a panel's load callback answers: the panel under the page's overlay (read from the service
    only when the page holds none for this run), or a figure that says what went wrong."""
    try:
        rid = inputs.run_id(run_id)
        page = valid_overlay(overlay, rid) or overlay_of(data.run_context(state, principal, rid))
        return load_panel(state, principal, rid, panel, page)
    except LLDMonError as exc:
        return empty_figure(error_text(exc)), None


def _log_range(
    panel: Panel, series: Iterable[Series], current: Sequence[float] | None = None
) -> list[float] | None:
    """The log10 extent of a log panel's values (what its tick spacing follows), as JSON."""
    if not panel.log_y:
        return None
    extent = log_range((v for s in series for v in s.values), (current[0], current[1]) if current else None)
    return None if extent is None else list(extent)


def _is_step(value: object, lowest: int = -1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lowest <= value <= inputs.MAX_BIGINT


def valid_cursor(cursor: object, run_id: int, panel: Panel) -> Cursor | None:
    """`cursor` if it is one `load_panel` made for this run and panel, else None (treated as not loaded)."""
    if not isinstance(cursor, dict) or cursor.get("run_id") != run_id or not _is_step(cursor["run_id"], 0):
        return None
    present, appended, extent = cursor.get("present"), cursor.get("appended"), cursor.get("log_range")
    band_end = cursor.get("band_end")
    if not (
        _is_step(cursor.get("last_step"))
        and (band_end is None or _is_step(band_end, 0))
        and isinstance(present, list)
        and all(isinstance(name, str) and name in panel.metrics for name in present)
        and len(set(present)) == len(present)
        and _is_step(appended, 0)
        and _is_step(cursor.get("rollbacks", 0), 0)
        and isinstance(cursor.get("signature"), str)
        and (
            extent is None
            or (
                isinstance(extent, list)
                and len(extent) == 2
                and all(isinstance(v, float | int) and not isinstance(v, bool) for v in extent)
            )
        )
    ):
        return None
    return cursor


def load_panels(
    state: DashboardPort, principal: Principal, run_id: object, *, max_points: int = MAX_POINTS
) -> tuple[list[Figure], list[Cursor]]:
    """Every panel as a page loads them: the context read once, then each panel's series."""
    run_id = inputs.run_id(run_id)
    overlay = overlay_of(data.run_context(state, principal, run_id))
    loaded = [load_panel(state, principal, run_id, p, overlay, max_points=max_points) for p in PANELS]
    return [f for f, _ in loaded], [c for _, c in loaded]


def _after(series: Series, step: int) -> Series:
    i = bisect.bisect_right(series.steps, step)
    return series if i == 0 else Series(series.name, series.steps[i:], series.values[i:])


def refresh_panels(
    state: DashboardPort,
    principal: Principal,
    run_id: object,
    cursors: Sequence[object],
    *,
    max_points: int = MAX_POINTS,
    rebuild_after: int = REBUILD_AFTER,
) -> tuple[list[PanelOutput], list[Cursor | Any]]:
    """Per panel: a Patch for the steps after its cursor, a full figure, or no_update (nothing changed,
    or the run id or a cursor is not one the page was given)."""
    outputs: list[PanelOutput] = [no_update] * len(PANELS)
    new_cursors: list[Cursor | Any] = [no_update] * len(PANELS)
    try:
        return _refresh(state, principal, inputs.run_id(run_id), cursors, max_points, rebuild_after)
    except LLDMonError:
        return outputs, new_cursors


def _refresh(
    state: DashboardPort,
    principal: Principal,
    run_id: int,
    raw_cursors: Sequence[object],
    max_points: int,
    rebuild_after: int,
) -> tuple[list[PanelOutput], list[Cursor | Any]]:
    outputs: list[PanelOutput] = [no_update] * len(PANELS)
    new_cursors: list[Cursor | Any] = [no_update] * len(PANELS)
    raw = [*list(raw_cursors)[: len(PANELS)], *[None] * (len(PANELS) - len(raw_cursors))]
    cursors = [valid_cursor(c, run_id, panel) for c, panel in zip(raw, PANELS, strict=True)]
    live = [c for c in cursors if c is not None]
    if not live:
        return outputs, new_cursors  # no panel loaded yet
    overlay = overlay_of(data.run_context(state, principal, run_id))
    step_min = min(int(c["last_step"]) for c in live) + 1
    new: dict[str, Series] = {}
    if step_min <= inputs.MAX_BIGINT:  # else nothing can come after the last step a step column holds
        new = data.series_map(state, principal, run_id, PANEL_METRICS, step_min=step_min)
    band_end = overlay["band_end"]
    for i, (panel, cursor) in enumerate(zip(PANELS, cursors, strict=True)):
        if cursor is None:
            continue  # its load has not answered yet
        last = int(cursor["last_step"])
        arrived = {name: _after(new[name], last) for name in panel.metrics if name in new}
        arrived = {name: s for name, s in arrived.items() if s.steps}
        signature_changed = overlay["signature"] != cursor["signature"]
        if not arrived and not signature_changed and band_end == cursor["band_end"]:
            continue
        had: list[str] = list(cursor["present"])
        appended = int(cursor["appended"]) + max((len(s.steps) for s in arrived.values()), default=0)
        rolled_back = overlay["rollbacks"] != cursor.get("rollbacks", 0)
        if appended > rebuild_after or rolled_back or any(name not in had for name in arrived):
            # A metric shows up for the first time, many raw points piled up, or the run rolled back
            # (the steps after the restored one were replaced): redraw the panel.
            outputs[i], new_cursors[i] = load_panel(
                state, principal, run_id, panel, overlay, max_points=max_points
            )
            continue
        patch = Patch()
        for name, s in arrived.items():
            trace = had.index(name)
            patch["data"][trace]["x"].extend(s.steps)
            patch["data"][trace]["y"].extend(s.values)
        patch["layout"]["shapes"] = overlay["shapes"]
        if signature_changed:
            patch["data"][len(had)] = overlay["markers"]
        extent = _log_range(panel, arrived.values(), cursor.get("log_range"))
        if extent != cursor.get("log_range"):  # the log axis' labels follow the widened range
            patch["layout"]["yaxis"]["dtick"] = log_dtick(None if extent is None else (extent[0], extent[1]))
        outputs[i] = patch
        new_cursors[i] = {
            "run_id": run_id,
            "last_step": max(
                [last, -1 if band_end is None else band_end, *(s.steps[-1] for s in arrived.values())]
            ),
            "band_end": band_end,
            "present": had,
            "appended": appended,
            "signature": overlay["signature"],
            "log_range": extent,
            "rollbacks": overlay["rollbacks"],
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
    def _refresh_callback(_tick: object, run_id: object, *cursors: object) -> tuple[Any, ...]:
        outputs, new_cursors = refresh_panels(ctx.state, current_principal(), run_id, cursors)
        return (*outputs, *new_cursors)


def _register_load(app: Dash, ctx: DashContext, panel: Panel) -> None:
    @app.callback(
        Output(f"panel-{panel.key}", "figure"),
        Output(f"cursor-{panel.key}", "data"),
        Input("run-id", "data"),
        State("run-overlay", "data"),
    )
    def _load(run_id: object, overlay: object) -> tuple[Any, Any]:
        return panel_load(ctx.state, current_principal(), run_id, panel, overlay)
