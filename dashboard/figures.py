"""Pure figure builders: plain data (domain objects, columns) in, plotly figures out. No I/O here.

Figures are plotly figure dicts ({"data": [...], "layout": {...}}, what dcc.Graph takes and what
`plotly.graph_objects.Figure(fig)` validates): building graph objects validates every point and costs
~100 ms per panel at 1,500 points, a large part of the run page's budget. The tests validate every
builder's output with `go.Figure`.

Titles: no figure draws a plotly title. Plotly sets it on one line in the top margin, the row where
the modebar (its toolbar) appears over the graph's top right corner, so a long title would run under the
toolbar and off the graph's edge. The pages show each graph's title as an HTML heading above the graph
(`dashboard.layout.graph_card`), where it wraps with the card's width; the top margin holds just the
modebar (`MODEBAR_ROW`). A figure whose title depends on its data (the action graphs: the step shown, how
many actions) names it as plain text in `layout.meta["title"]` (`figure_title`) for the page's heading;
the panels' and the compare graphs' titles are fixed (the panel's, the metric) and the page writes them.

Conventions shared by every run-page panel:
- one line trace per metric that has data, in the panel's order, then ONE marker trace (alerts,
  directives, phase changes) on a hidden overlay axis `y2` (0..1), so markers sit on the x axis whatever
  the data's scale; the live refresh relies on that order to extend traces in place;
- phase bands (stagnation, decay, collapse) are layout rectangles behind the data, named
  `phase:<phase>`; each runs from its event's step to the next event's step (the last one to the
  run's last step);
- a metric without data is named in an annotation "no data for <metric>" instead of failing;
- text that comes from users or their runs (run and metric names, alert messages, directive reasons,
  evidence) goes through `esc` first: plotly renders `<a href>`, `<b>` etc. in every text, so an
  unescaped run name would be a link in a legend.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from dashboard.panels import LOG_METRICS, Panel
from dashboard.theme import (
    BAND_OPACITY,
    BANDED_PHASES,
    DIRECTIVE_COLORS,
    MARKER_SYMBOLS,
    PHASE_COLORS,
    PHASE_MARKER_COLOR,
    ROLLBACK_COLOR,
    SERIES_COLORS,
    SEVERITY_COLORS,
)
from monitor.detector.explain import (
    PHASE_DESCRIPTIONS,
    alert_steps,
    explain_finding,
    explain_phase_change,
)
from monitor.domain import ActionSummaries, AlertInfo, DirectiveInfo, PhaseEventInfo, RollbackInfo, Series

PANEL_HEIGHT = 270
ACTION_HEIGHT = PANEL_HEIGHT + 30
COMPARE_HEIGHT = PANEL_HEIGHT + 20
MARKER_TRACE_NAME = "events"
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
"""Levels of the action-delta bands: the service's summary levels (`ActionSummaries.levels`, stored with
each action block; the dashboard reads them from the summaries, never from the store)."""
HOVER_LINES = 8
"""Explanation lines in a marker's hover label (the timeline shows them all)."""

LOG_LABELS = 6
"""At most this many labels on a log axis spanning a decade or more (powers of ten only)."""
LEGEND_ROW = 26
"""Pixels below the x-axis title for a horizontal legend (histogram, quantiles)."""
MODEBAR_ROW = 30
"""Top margin of every figure: the row plotly's modebar takes (buttons 22 px high, 2 px from the top), so
the toolbar covers no data; the graph's title is a heading above it (see the module docstring)."""
HISTOGRAM_TITLE = "Action deltas D_action"

Figure = dict[str, Any]
"""A plotly figure as a dict: {"data": [trace, ...], "layout": {...}}."""


def esc(text: object) -> str:
    """User or run text as plotly text: shown literally, never as markup (plotly decodes entities)."""
    return html.escape(str(text), quote=False)


@dataclass(frozen=True)
class Band:
    phase: str
    x0: int
    x1: int


@dataclass(frozen=True)
class Marker:
    step: int
    group: str
    """"alert", "directive" or "phase"."""
    label: str
    color: str
    symbol: str
    hover: str


# --- phases and markers ---------------------------------------------------------------------------------


def phase_bands(events: Sequence[PhaseEventInfo], last_step: int | None) -> list[Band]:
    """Stagnation/decay/collapse intervals: each phase runs from its event step to the next event."""
    ordered = sorted(events, key=lambda e: (e.step, e.id))
    bands: list[Band] = []
    for i, event in enumerate(ordered):
        is_last = i + 1 == len(ordered)
        next_step = ordered[i + 1].step if not is_last else last_step
        end = max(event.step if next_step is None else next_step, event.step)
        if event.phase in BANDED_PHASES and (end > event.step or is_last):
            bands.append(Band(event.phase, event.step, end))
    return bands


def band_shapes(bands: Sequence[Band]) -> list[dict[str, Any]]:
    return [
        {
            "type": "rect",
            "name": f"phase:{b.phase}",
            "xref": "x",
            "yref": "paper",
            "x0": b.x0,
            "x1": b.x1 if b.x1 > b.x0 else b.x0 + 0.5,
            "y0": 0,
            "y1": 1,
            "fillcolor": PHASE_COLORS[b.phase],
            "opacity": BAND_OPACITY,
            "line": {"width": 0},
            "layer": "below",
        }
        for b in bands
    ]


def _limited(lines: list[str], limit: int) -> list[str]:
    if len(lines) > limit:
        return [*lines[:limit], f"... {len(lines) - limit} more"]
    return lines


def _hover_lines(lines: Sequence[str], limit: int = HOVER_LINES) -> list[str]:
    """Explanation lines wrapped for a hover label (plotly wraps nothing by itself)."""
    return [_wrap(line) for line in _limited(list(lines), limit)]


def alert_markers(alerts: Sequence[AlertInfo]) -> list[Marker]:
    return [
        Marker(
            step=a.first_step,
            group="alert",
            label=a.kind,
            color=SEVERITY_COLORS.get(a.severity, "#c62828"),
            symbol=MARKER_SYMBOLS["alert"],
            hover="<br>".join(
                [
                    f"<b>alert {esc(a.kind)}</b> ({esc(a.severity)}, {esc(a.status)})",
                    alert_steps(a.first_step, a.last_step, a.reopen_count),
                    _wrap(a.message),
                    *_hover_lines(explain_finding(a.kind, "", a.evidence, a.first_step)),
                ]
            ),
        )
        for a in alerts
    ]


def directive_markers(directives: Sequence[DirectiveInfo]) -> list[Marker]:
    return [
        Marker(
            step=d.step or 0,
            group="directive",
            label=f"LLDS {'on' if d.llds.enabled else 'off'}",
            color=DIRECTIVE_COLORS[d.llds.enabled],
            symbol=MARKER_SYMBOLS["directive"],
            hover="<br>".join(
                [
                    f"<b>directive v{d.version}: LLDS {'on' if d.llds.enabled else 'off'}</b>"
                    f" (λ={d.llds.lam:g})",
                    f"source: {esc(d.source)}",
                    _wrap(d.reason),
                ]
            ),
        )
        for d in directives
        if d.version > 0
    ]


def phase_markers(events: Sequence[PhaseEventInfo]) -> list[Marker]:
    return [
        Marker(
            step=e.step,
            group="phase",
            label=e.phase,
            color=PHASE_COLORS.get(e.phase, PHASE_MARKER_COLOR),
            symbol=MARKER_SYMBOLS["phase"],
            hover=_phase_hover(e),
        )
        for e in events
    ]


def _phase_hover(e: PhaseEventInfo) -> str:
    headline, *lines = explain_phase_change(e.phase, e.previous_phase, e.evidence, e.step)
    return "<br>".join([f"<b>phase {_wrap(headline)}</b>", *_hover_lines(lines)])


def rollback_markers(rollbacks: Sequence[RollbackInfo]) -> list[Marker]:
    """One marker per rollback, at the step it restored: the steps after it were trained, undone and
    trained again (the series show the new attempt)."""
    return [
        Marker(
            step=r.to_step,
            group="rollback",
            label="rolled back",
            color=ROLLBACK_COLOR,
            symbol=MARKER_SYMBOLS["rollback"],
            hover="<br>".join(
                [
                    f"<b>rolled back to step {r.to_step}</b> from step {r.from_step}",
                    f"{r.steps_redone} steps redone (directive v{r.version})",
                    "undone: "
                    + esc(
                        ", ".join(f"{p['phase']} at {p['step']}" for p in r.undone_phases)
                        or "no phase change"
                    ),
                ]
            ),
        )
        for r in rollbacks
    ]


def markers_of(
    alerts: Sequence[AlertInfo],
    directives: Sequence[DirectiveInfo],
    events: Sequence[PhaseEventInfo],
    rollbacks: Sequence[RollbackInfo] = (),
) -> list[Marker]:
    return [
        *phase_markers(events),
        *alert_markers(alerts),
        *directive_markers(directives),
        *rollback_markers(rollbacks),
    ]


@dataclass(frozen=True)
class LegendEntry:
    group: str
    """"band" (a phase's colour: badge, shaded band, phase-change marker) or a marker group."""
    key: str
    label: str
    color: str
    symbol: str | None
    """The marker's plotly symbol (None for a phase colour)."""
    description: str = ""
    banded: bool = False


def legend_entries() -> list[LegendEntry]:
    """What the run page's colours and marker shapes mean, derived from the constants the figures use."""
    entries = [
        LegendEntry(
            "band",
            phase,
            phase,
            color,
            None,
            PHASE_DESCRIPTIONS.get(phase, ""),
            banded=phase in BANDED_PHASES,
        )
        for phase, color in PHASE_COLORS.items()
    ]
    entries.append(
        LegendEntry(
            "phase",
            "phase",
            "phase change (in the new phase's colour)",
            "#1f2328",  # drawn in each phase's own colour (PHASE_MARKER_COLOR for a phase without one)
            MARKER_SYMBOLS["phase"],
            "at the step the detector changed phase",
        )
    )
    entries += [
        LegendEntry(
            "alert",
            severity,
            f"{severity} alert",
            color,
            MARKER_SYMBOLS["alert"],
            "at the first step of the alert",
        )
        for severity, color in SEVERITY_COLORS.items()
    ]
    entries += [
        LegendEntry(
            "directive",
            f"llds-{'on' if enabled else 'off'}",
            f"directive: LLDS {'on' if enabled else 'off'}",
            color,
            MARKER_SYMBOLS["directive"],
            "trainer directive issued at this step",
        )
        for enabled, color in sorted(DIRECTIVE_COLORS.items(), reverse=True)
    ]
    entries.append(
        LegendEntry(
            "rollback",
            "rollback",
            "rollback",
            ROLLBACK_COLOR,
            MARKER_SYMBOLS["rollback"],
            "the trainer restored this step's checkpoint; the steps after it were trained again",
        )
    )
    return entries


_MARKER_Y = {"phase": 0.02, "alert": 0.05, "directive": 0.11, "rollback": 0.08}


def marker_trace(markers: Sequence[Marker]) -> dict[str, Any]:
    """All markers of a panel in one trace on the hidden overlay axis (y2: 0 = the x axis)."""
    colors = [m.color for m in markers]
    return {
        "type": "scatter",
        "name": MARKER_TRACE_NAME,
        "x": [m.step for m in markers],
        "y": [_MARKER_Y.get(m.group, 0.05) for m in markers],
        "yaxis": "y2",
        "mode": "markers",
        "showlegend": False,
        "marker": {
            "symbol": [m.symbol for m in markers],
            "color": colors,
            "size": [14 if m.group == "phase" else 11 for m in markers],
            "line": {"width": 2, "color": colors},
        },
        "customdata": [m.group for m in markers],
        "hovertext": [m.hover for m in markers],
        "hoverinfo": "text",
        "hoverlabel": {"align": "left"},
    }


def _wrap(text: str, width: int = 90) -> str:
    """`text` escaped (see `esc`) and broken into hover-label lines."""
    words, lines, line = esc(text).split(), [], ""
    for word in words:
        if line and len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return "<br>".join(lines)


# --- run-page panels ------------------------------------------------------------------------------------


def present_metrics(panel: Panel, series: Mapping[str, Series]) -> list[str]:
    """The panel's metrics that have at least one point, in panel order (= trace order)."""
    return [name for name in panel.metrics if name in series and len(series[name].steps) > 0]


def line_trace(name: str, series: Series, color: str) -> dict[str, Any]:
    """`name` is shown as given: escape user text first."""
    return {
        "type": "scatter",
        "name": name,
        # Plain lists, not numpy arrays: plotly would send those base64-encoded, and a live refresh
        # must be able to extend the trace's x/y arrays in the browser.
        "x": list(series.steps),
        "y": list(series.values),
        "mode": "lines",
        "line": {"width": 1.6, "color": color},
        # The name by reference: a "%{" in a metric or run name is not a template variable.
        "hovertemplate": "%{fullData.name}<br>step %{x}: %{y:.4g}<extra></extra>",
    }


def _note(text: str, *, center: bool, name: str) -> dict[str, Any]:
    if center:
        return {
            "text": text,
            "xref": "paper",
            "yref": "paper",
            "x": 0.5,
            "y": 0.5,
            "showarrow": False,
            "font": {"size": 14, "color": "#6a737d"},
            "name": name,
        }
    return {
        "text": text,
        "xref": "paper",
        "yref": "paper",
        "x": 1,
        "y": 1.0,
        "xanchor": "right",
        "yanchor": "bottom",
        "showarrow": False,
        "font": {"size": 11, "color": "#6a737d"},
        "name": name,
    }


def missing_annotations(panel: Panel, present: Sequence[str]) -> list[dict[str, Any]]:
    """ "no data for <metric>": centred when the panel is empty, small in a corner when partly empty
    (optional metrics are named only when the panel is empty)."""
    missing = [name for name in panel.metrics if name not in present]
    if not present:
        required = [name for name in missing if name not in panel.optional]
        missing = required or missing
    else:
        missing = [name for name in missing if name not in panel.optional]
    if not missing:
        return []
    if not present:
        return [
            _note(
                "<br>".join(f"no data for {esc(name)}" for name in missing), center=True, name="empty-state"
            )
        ]
    return [_note(", ".join(f"no data for {esc(name)}" for name in missing), center=False, name="missing")]


def figure_title(figure: Figure) -> str:
    """The title a figure names itself by, as plain text for an HTML heading ("" if it names none)."""
    meta = figure["layout"].get("meta") or {}
    return str(meta.get("title", ""))


LogRange = tuple[float, float]
"""(log10 of the smallest, log10 of the largest) positive finite value on a log axis."""


def log_range(values: Iterable[float | None], current: LogRange | None = None) -> LogRange | None:
    """The log10 extent of the positive finite `values`, widened by `current`; None if there are none."""
    array = np.asarray(list(values), dtype=np.float64)
    array = array[np.isfinite(array) & (array > 0)]
    if not array.size:
        return current
    lo, hi = float(np.log10(array.min())), float(np.log10(array.max()))
    return (lo, hi) if current is None else (min(lo, current[0]), max(hi, current[1]))


def log_dtick(extent: LogRange | None) -> int | None:
    """Decades between labels of a log axis: over most of a decade or more, plotly's own ticks label
    every digit or the 2s and 5s between the powers of ten (unreadable at a panel's height), so label
    powers of ten only, at most LOG_LABELS of them; None leaves plotly's ticks (inside one decade)."""
    if extent is None or extent[1] - extent[0] < 0.8:
        return None
    return max(1, math.ceil((extent[1] - extent[0]) / (LOG_LABELS - 1)))


def _y_axis(log: bool, extent: LogRange | None, **extra: Any) -> dict[str, Any]:
    axis: dict[str, Any] = {"type": "log" if log else "linear", "gridcolor": "#eef0f3", **extra}
    dtick = log_dtick(extent) if log else None
    if dtick is not None:
        axis["dtick"] = dtick
    return axis


def _figure(data: list[dict[str, Any]], layout: dict[str, Any]) -> Figure:
    base = {"plot_bgcolor": "#ffffff", "paper_bgcolor": "#ffffff"}
    return {"data": data, "layout": {**base, **layout}}


def panel_figure(
    panel: Panel,
    series: Mapping[str, Series],
    shapes: Sequence[dict[str, Any]] = (),
    markers: dict[str, Any] | None = None,
    *,
    uirevision: Any = None,
) -> Figure:
    """One run-page panel: a line per metric of the panel that has data, the phase bands' `shapes`
    (`band_shapes`) and the event markers' trace (`marker_trace`; None: no markers). Bands and markers
    come drawn because every panel of a page shares them."""
    present = present_metrics(panel, series)
    traces = [
        line_trace(esc(name), series[name], SERIES_COLORS[panel.metrics.index(name) % len(SERIES_COLORS)])
        for name in present
    ]
    extent = log_range(v for name in present for v in series[name].values) if panel.log_y else None
    traces.append(marker_trace(()) if markers is None else markers)
    return _figure(
        traces,
        {
            "height": PANEL_HEIGHT,
            "margin": {"l": 55, "r": 15, "t": MODEBAR_ROW, "b": 35},
            "legend": {"orientation": "h", "y": -0.12, "x": 0, "font": {"size": 11}},
            "hovermode": "closest",
            "xaxis": {"gridcolor": "#eef0f3", "zeroline": False},
            "yaxis": _y_axis(panel.log_y, extent, title={"text": panel.y_title}),
            "yaxis2": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
            "shapes": list(shapes),
            "annotations": missing_annotations(panel, present),
            "uirevision": uirevision,
            "meta": {"panel": panel.key, "metrics": present},
        },
    )


def empty_figure(message: str, height: int = PANEL_HEIGHT, title: str = "") -> Figure:
    """A placeholder figure that says why there is nothing to show (`message` is escaped; `title`, the
    plain text of the page's heading, goes into `layout.meta`, which plotly does not draw)."""
    return _figure(
        [],
        {
            "meta": {"title": title},
            "height": height,
            "margin": {"l": 30, "r": 15, "t": MODEBAR_ROW, "b": 30},
            "xaxis": {"visible": False},
            "yaxis": {"visible": False},
            "annotations": [_note(esc(message), center=True, name="empty-state")],
        },
    )


# --- action-delta distribution ---------------------------------------------------------------------------


def action_step(columns: Mapping[str, Sequence[Any]], requested: int | None) -> int | None:
    """The step to show: the last step <= `requested` that has action records (None if none)."""
    steps = np.asarray(columns.get("step", []), dtype=np.int64)
    if requested is not None:
        steps = steps[steps <= requested]
    return int(steps.max()) if steps.size else None


def _floats(values: Sequence[Any]) -> npt.NDArray[np.float64]:
    return np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def _zero_line(axis: str) -> dict[str, Any]:
    line = {"type": "line", "line": {"color": "#1f2328", "width": 1, "dash": "dot"}}
    if axis == "x":
        return {**line, "xref": "x", "yref": "paper", "x0": 0, "x1": 0, "y0": 0, "y1": 1}
    return {**line, "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": 0, "y1": 0}


def _legend_below_axis_title() -> dict[str, Any]:
    """A horizontal legend in its own row at the figure's bottom edge (pixels, not a fraction of the
    plot height, which put it on top of the x-axis title), below the margin's ticks and title."""
    return {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0, "xanchor": "left"}


def delta_histogram(columns: Mapping[str, Sequence[Any]], step: int | None) -> Figure:
    """Histogram of D_action at one step, correct (A>0) and incorrect (A<0) responses overlaid."""
    title = HISTOGRAM_TITLE + (f" at step {step}" if step is not None else "")
    if step is None:
        return empty_figure("no action records at or before this step", title=title, height=ACTION_HEIGHT)
    at = np.asarray(columns["step"], dtype=np.int64) == step
    delta = _floats(columns["delta"])[at]
    adv = _floats(columns["advantage"])[at]
    traces = []
    for label, mask, color in (
        ("A>0 (correct)", adv > 0, SERIES_COLORS[0]),
        ("A<0 (incorrect)", adv < 0, SERIES_COLORS[1]),
        ("A=0", adv == 0, "#9e9e9e"),
    ):
        values = delta[mask & np.isfinite(delta)]
        if values.size:
            traces.append(
                {
                    "type": "histogram",
                    "x": values.tolist(),
                    "name": f"{label} n={values.size}",
                    "marker": {"color": color},
                    "opacity": 0.6,
                }
            )
    return _figure(
        traces,
        {
            "meta": {"title": f"{title} ({int(at.sum())} actions)"},
            "barmode": "overlay",
            "height": ACTION_HEIGHT,
            "margin": {"l": 50, "r": 15, "t": MODEBAR_ROW, "b": 40 + LEGEND_ROW},
            "xaxis": {"title": {"text": "D_action = Σ (log π_new − log π_old)   < 0: likelihood fell"}},
            "yaxis": {"title": {"text": "actions"}},
            "legend": _legend_below_axis_title(),
            "shapes": [_zero_line("x")],
        },
    )


PRUNED_TEXT = "raw records pruned by retention; quantiles kept"


def pruned_histogram(step: int) -> Figure:
    """The histogram's place at a step whose raw records retention dropped (its summary is kept)."""
    return empty_figure(PRUNED_TEXT, title=f"{HISTOGRAM_TITLE} at step {step}", height=ACTION_HEIGHT)


def delta_quantiles(columns: Mapping[str, Sequence[Any]], positive_only: bool = True) -> Figure:
    """How the D_action distribution shifts over steps: median, 25-75 % and 10-90 % bands per step,
    computed from raw records (the run page reads precomputed summaries: `summary_quantiles`)."""
    title = quantiles_title(positive_only)
    frame = pd.DataFrame(
        {
            "step": np.asarray(columns.get("step", []), dtype=np.int64),
            "delta": _floats(columns.get("delta", [])),
        }
    )
    if positive_only and len(frame):
        frame = frame[_floats(columns["advantage"]) > 0]
    frame = frame[np.isfinite(frame["delta"])]
    if frame.empty:
        return empty_figure("no action records in this window", title=title, height=ACTION_HEIGHT)
    q = frame.groupby("step")["delta"].quantile(list(QUANTILES)).unstack()
    return _quantile_bands(q.index.to_numpy(), q[list(QUANTILES)].to_numpy(), title)


def summary_quantiles(summaries: ActionSummaries, positive_only: bool = True) -> Figure:
    """`delta_quantiles` from the per-step summaries stored with each action block: the same bands
    for any window length (no raw record is read) and for steps whose raw records were pruned.

    With both sources in the window (source "all"), each gets its own bands: the probe's exact deltas
    and the loss's cross-mini-batch proxy are different quantities, and their pooled quantiles are not
    stored (nor recoverable from the two sets)."""
    title = quantiles_title(positive_only)
    levels = np.asarray(summaries.levels, dtype=np.float64)
    steps = np.asarray(summaries.steps, dtype=np.int64)
    sources = np.asarray(summaries.sources, dtype=object)
    counts = np.asarray(summaries.n_pos if positive_only else summaries.n_all, dtype=np.int64)
    rows = summaries.q_pos if positive_only else summaries.q_all
    q = np.asarray(rows, dtype=np.float64).reshape(len(steps), len(levels))
    keep = (counts > 0) & np.isfinite(q).all(axis=1)
    steps, sources, q = steps[keep], sources[keep], q[keep]
    if not steps.size:
        return empty_figure("no action records in this window", title=title, height=ACTION_HEIGHT)
    wanted = [int(np.argmin(np.abs(levels - level))) for level in QUANTILES]
    present = sorted(set(sources.tolist()))
    traces: list[dict[str, Any]] = []
    for i, source in enumerate(present):
        mine = sources == source
        order = np.argsort(steps[mine], kind="stable")
        prefix = f"{source} " if len(present) > 1 else ""
        traces += _band_traces(steps[mine][order], q[mine][order][:, wanted], prefix, i)
    return _quantile_figure(traces, title)


def quantiles_title(positive_only: bool = True) -> str:
    return "D_action quantiles over steps" + (" (A>0 actions)" if positive_only else "")


def _quantile_bands(steps: npt.NDArray[np.int64], q: npt.NDArray[np.float64], title: str) -> Figure:
    """Bands p10-p90 and p25-p75 and the median line; `q` has one column per level of QUANTILES."""
    return _quantile_figure(_band_traces(steps, q, "", 0), title)


_BAND_RGB = ("31,119,180", "255,127,14")


def _band_traces(
    steps: npt.NDArray[np.int64], q: npt.NDArray[np.float64], prefix: str, color: int
) -> list[dict[str, Any]]:
    x = steps.tolist()
    column = {level: q[:, j].tolist() for j, level in enumerate(QUANTILES)}
    rgb = _BAND_RGB[color % len(_BAND_RGB)]
    traces: list[dict[str, Any]] = []
    for lo, hi, alpha in ((0.1, 0.9, 0.15), (0.25, 0.75, 0.3)):
        traces.append(
            {
                "type": "scatter",
                "x": x,
                "y": column[hi],
                "mode": "lines",
                "line": {"width": 0},
                "showlegend": False,
                "hoverinfo": "skip",
            }
        )
        traces.append(
            {
                "type": "scatter",
                "x": x,
                "y": column[lo],
                "mode": "lines",
                "line": {"width": 0},
                "fill": "tonexty",
                "fillcolor": f"rgba({rgb},{alpha})",
                "name": f"{prefix}p{round(lo * 100)}-p{round(hi * 100)}",
                "hoverinfo": "skip",
            }
        )
    traces.append(
        {
            "type": "scatter",
            "x": x,
            "y": column[0.5],
            "mode": "lines+markers" if len(x) < 60 else "lines",
            "name": f"{prefix}median",
            "line": {"color": SERIES_COLORS[0] if color == 0 else f"rgb({rgb})", "width": 2},
            "hovertemplate": f"{esc(prefix)}step %{{x}}: median %{{y:.4g}}<extra></extra>",
        }
    )
    return traces


def _quantile_figure(traces: list[dict[str, Any]], title: str) -> Figure:
    return _figure(
        traces,
        {
            "meta": {"title": title},
            "height": ACTION_HEIGHT,
            "margin": {"l": 50, "r": 15, "t": MODEBAR_ROW, "b": 40 + LEGEND_ROW},
            "xaxis": {"title": {"text": "step"}},
            "yaxis": {"title": {"text": "D_action"}},
            "legend": _legend_below_axis_title(),
            "shapes": [_zero_line("y")],
        },
    )


# --- compare page ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareRun:
    label: str
    series: Series | None
    collapse_step: int | None = None


def compare_figure(metric: str, runs: Sequence[CompareRun]) -> Figure:
    """One metric of several runs overlaid, aligned by step; dashed line where each run collapsed.

    `metric` and the runs' labels are user text: escaped here."""
    if not any(r.series is not None and r.series.steps for r in runs):
        return empty_figure(f"no data for {metric}", height=COMPARE_HEIGHT)
    runs = [CompareRun(esc(r.label), r.series, r.collapse_step) for r in runs]
    log = metric in LOG_METRICS
    extent = log_range(v for r in runs if r.series is not None for v in r.series.values) if log else None
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        if run.series is not None and run.series.steps:
            traces.append(line_trace(run.label, run.series, color))
        if run.collapse_step is not None:
            shapes.append(
                {
                    "type": "line",
                    "name": f"collapse:{run.label}",
                    "xref": "x",
                    "yref": "paper",
                    "x0": run.collapse_step,
                    "x1": run.collapse_step,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": color, "width": 1.5, "dash": "dash"},
                }
            )
            annotations.append(
                {
                    "text": "collapse",
                    "x": run.collapse_step,
                    "xref": "x",
                    "y": 1,
                    "yref": "paper",
                    "showarrow": False,
                    "yanchor": "bottom",
                    "font": {"size": 10, "color": color},
                }
            )
    missing = [r.label for r in runs if r.series is None or not r.series.steps]
    if missing:
        annotations.append(
            _note(f"no data for {esc(metric)} in " + ", ".join(missing), center=False, name="missing")
        )
    return _figure(
        traces,
        {
            "height": COMPARE_HEIGHT,
            "margin": {"l": 55, "r": 15, "t": MODEBAR_ROW, "b": 35},
            "xaxis": {"gridcolor": "#eef0f3"},
            "yaxis": _y_axis(log, extent),
            "legend": {"orientation": "h", "y": -0.2},
            "hovermode": "x unified",
            "shapes": shapes,
            "annotations": annotations,
        },
    )
