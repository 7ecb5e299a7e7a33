"""Figure builders as pure functions: data in, plotly figure out."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from plotly.io.json import to_json_plotly

from contracts import metrics as M
from contracts.directive import LLDSDirective
from dashboard import figures as F
from dashboard.figures import (
    Band,
    CompareRun,
    action_step,
    band_shapes,
    marker_trace,
    markers_of,
    phase_bands,
)
from dashboard.panels import PANEL_METRICS, PANELS_BY_KEY
from dashboard.theme import (
    BANDED_PHASES,
    DIRECTIVE_COLORS,
    MARKER_SYMBOLS,
    PHASE_COLORS,
    SEVERITY_COLORS,
    SYMBOL_GLYPHS,
)
from monitor.detector.explain import explain_evidence
from monitor.domain import AlertInfo, DirectiveInfo, PhaseEventInfo, Series

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def event(i: int, step: int, phase: str, previous: str | None = None, **evidence: Any) -> PhaseEventInfo:
    return PhaseEventInfo(i, 1, step, phase, previous, evidence, NOW)


def alert(i: int, step: int, kind: str = "lld_collapse", severity: str = "critical") -> AlertInfo:
    return AlertInfo(
        i, 1, kind, severity, "open", f"{kind} message", {"metric": "grad/norm"}, step, step, NOW, NOW
    )


# The builders return plotly figure dicts; every test validates them by building the graph object.


def panel_figure(*args: Any, **kwargs: Any) -> go.Figure:
    return go.Figure(F.panel_figure(*args, **kwargs))


def empty_figure(*args: Any, **kwargs: Any) -> go.Figure:
    return go.Figure(F.empty_figure(*args, **kwargs))


def delta_histogram(*args: Any, **kwargs: Any) -> go.Figure:
    return go.Figure(F.delta_histogram(*args, **kwargs))


def delta_quantiles(*args: Any, **kwargs: Any) -> go.Figure:
    return go.Figure(F.delta_quantiles(*args, **kwargs))


def compare_figure(*args: Any, **kwargs: Any) -> go.Figure:
    return go.Figure(F.compare_figure(*args, **kwargs))


EVENTS = [
    event(1, 19, "healthy", "warmup"),
    event(2, 27, "stagnation", "healthy"),
    event(3, 88, "healthy", "stagnation"),
    event(4, 101, "decay", "healthy"),
    event(
        5,
        136,
        "collapse",
        "decay",
        note="phase III",
        signals={
            "grad_surge": {
                "fired": True,
                "metric": "grad/norm",
                "statistic": 7.3,
                "threshold": 5.0,
                "window": 5,
                "statistic_is": "ratio of recent median to baseline median",
                "recent_median": 5.84,
                "baseline_median": 0.8,
            }
        },
        degraded=False,
    ),
]


def series(name: str, n: int = 50, start: int = 0) -> Series:
    return Series(name, list(range(start, start + n)), [float(i) / 10 for i in range(n)])


def test_phase_bands_run_from_each_event_to_the_next_and_the_last_to_the_last_step() -> None:
    bands = phase_bands(EVENTS, last_step=208)
    assert bands == [Band("stagnation", 27, 88), Band("decay", 101, 136), Band("collapse", 136, 208)]
    # warmup/healthy are not shaded; events come in any order
    assert phase_bands(list(reversed(EVENTS)), 208) == bands
    assert phase_bands([], 10) == []
    # a phase entered at the very last step still shows (as a sliver)
    assert phase_bands([event(1, 50, "collapse")], 50) == [Band("collapse", 50, 50)]
    assert band_shapes([Band("collapse", 50, 50)])[0]["x1"] == 50.5


def test_band_shapes_are_named_paper_height_rectangles_behind_the_data() -> None:
    shapes = band_shapes(phase_bands(EVENTS, 208))
    assert [(s["name"], s["x0"], s["x1"]) for s in shapes] == [
        ("phase:stagnation", 27, 88),
        ("phase:decay", 101, 136),
        ("phase:collapse", 136, 208),
    ]
    for s in shapes:
        assert s["type"] == "rect" and s["layer"] == "below"
        assert (s["xref"], s["yref"], s["y0"], s["y1"]) == ("x", "paper", 0, 1)
    assert shapes[2]["fillcolor"] == PHASE_COLORS["collapse"]


def test_panel_figure_has_a_trace_per_metric_then_the_marker_trace_and_bands() -> None:
    panel = PANELS_BY_KEY["logp"]
    data = {M.LOGP_POS: series(M.LOGP_POS), M.LOGP_NEG: series(M.LOGP_NEG)}
    fig = panel_figure(
        panel,
        data,
        band_shapes(phase_bands(EVENTS, 49)),
        marker_trace(markers_of([alert(1, 40)], [], EVENTS)),
    )
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == [M.LOGP_POS, M.LOGP_NEG, "events"]
    assert list(fig.data[0].x) == list(range(50))
    assert fig.data[-1].yaxis == "y2" and fig.layout.yaxis2.overlaying == "y"
    assert [s.name for s in fig.layout.shapes] == ["phase:stagnation", "phase:decay", "phase:collapse"]
    assert fig.layout.annotations == ()
    assert fig.layout.yaxis.type == "linear"


def test_grad_norm_panel_uses_a_log_axis() -> None:
    fig = panel_figure(PANELS_BY_KEY["grad"], {M.GRAD_NORM: series(M.GRAD_NORM)})
    assert fig.layout.yaxis.type == "log"


def test_missing_metrics_give_an_empty_state_instead_of_failing() -> None:
    empty = panel_figure(PANELS_BY_KEY["llds"], {})
    assert [t.name for t in empty.data] == ["events"]
    text = empty.layout.annotations[0].text
    assert "no data for llds/active" in text and "no data for llds/loss" in text
    partial = panel_figure(PANELS_BY_KEY["ratio"], {M.RATIO_POS_MEAN: series(M.RATIO_POS_MEAN)})
    assert [t.name for t in partial.data] == [M.RATIO_POS_MEAN, "events"]
    assert partial.layout.annotations[0].text == "no data for ratio/pos_min, no data for ratio/pos_frac_low"
    # a series without points counts as missing
    assert panel_figure(
        PANELS_BY_KEY["reward"], {M.REWARD_MEAN: Series(M.REWARD_MEAN, [], [])}
    ).layout.annotations


def test_markers_for_alerts_directives_and_phase_changes_carry_hover_evidence() -> None:
    directives = [
        DirectiveInfo(llds=LLDSDirective(True, 0.3), version=2, reason="manual", source="manual", step=150),
        DirectiveInfo(
            llds=LLDSDirective(True), version=1, reason="auto: run entered decay", source="detector", step=105
        ),
        DirectiveInfo(),  # the implicit default: no marker
    ]
    markers = markers_of([alert(7, 140)], directives, EVENTS)
    trace = marker_trace(markers)
    groups = list(zip(trace["customdata"], trace["x"], strict=True))
    assert ("alert", 140) in groups and ("directive", 150) in groups and ("directive", 105) in groups
    assert sum(1 for g, _ in groups if g == "phase") == len(EVENTS)
    assert len(groups) == len(EVENTS) + 3
    hover = dict(zip(trace["customdata"], trace["hovertext"], strict=False))
    assert "lld_collapse" in hover["alert"] and "grad/norm" in hover["alert"]
    collapse_hover = trace["hovertext"][4]
    assert "decay → collapse at step 136: phase III" in collapse_hover
    assert (
        "gradient-norm surge: ratio of recent median to baseline median = 7.3 (threshold 5)" in collapse_hover
    )
    assert "grad/norm now 5.84 vs baseline 0.8" in collapse_hover
    assert "degraded" not in collapse_hover and "False" not in collapse_hover
    assert all(y < 0.2 for y in trace["y"])  # on the x axis (overlay axis 0..1)


def test_evidence_lines_put_fired_signals_first_in_words() -> None:
    lines = explain_evidence(
        {
            "signals": {
                "a_signal": {"fired": False, "statistic": 1.0},
                "reward_rising": {
                    "fired": True,
                    "metric": "reward/mean",
                    "statistic": 6.97,
                    "statistic_is": "Mann-Kendall Z",
                    "window": 71,
                },
            },
            "note": "x",
            "active_at": 110,
            "phase_since": 40,
            "degraded": False,
        }
    )
    assert lines == [
        "reward still rising on reward/mean: Mann-Kendall Z = 6.97 over the last 71 steps (steps 40-110)",
        "checked, not fired: a signal 1",  # last, under its heading: never read as a reason
    ]


def test_hover_lines_are_wrapped_and_limited() -> None:
    degraded = {"degraded": True, "explanation": "likelihood metrics are absent " * 8}
    alert = AlertInfo(1, 1, "kl_blowup", "critical", "open", "KL blew up", degraded, 5, 9, NOW, NOW)
    hover = markers_of([alert], [], [])[0].hover
    assert "degraded mode: likelihood metrics" in hover
    assert all(len(part) <= 100 for part in hover.split("<br>"))
    healthy = AlertInfo(
        1, 1, "kl_blowup", "critical", "open", "KL", {**degraded, "degraded": False}, 5, 9, NOW, NOW
    )
    assert "likelihood metrics" not in markers_of([healthy], [], [])[0].hover


def test_legend_lists_every_phase_colour_and_marker_kind() -> None:
    entries = F.legend_entries()
    bands = {e.key: e for e in entries if e.group == "band"}
    assert list(bands) == list(PHASE_COLORS)
    assert all(bands[p].color == PHASE_COLORS[p] and bands[p].description for p in PHASE_COLORS)
    assert {p for p, e in bands.items() if e.banded} == set(BANDED_PHASES)
    markers = [e for e in entries if e.symbol is not None]
    assert {e.group for e in markers} == set(MARKER_SYMBOLS)
    assert all(e.symbol == MARKER_SYMBOLS[e.group] for e in markers)
    assert {e.key for e in markers if e.group == "alert"} == set(SEVERITY_COLORS)
    assert {e.color for e in markers if e.group == "directive"} == set(DIRECTIVE_COLORS.values())
    # every marker the figures draw has a legend entry with its shape and colour
    directives = [DirectiveInfo(llds=LLDSDirective(v == 1), version=v, step=v) for v in (1, 2)]
    alerts = [alert(i, 10 + i, severity=sev) for i, sev in enumerate(SEVERITY_COLORS)]
    drawn = {(m.group, m.symbol, m.color) for m in markers_of(alerts, directives, [])}
    assert drawn <= {(e.group, e.symbol, e.color) for e in markers}
    assert all(e.symbol in SYMBOL_GLYPHS for e in markers)


def test_figures_serialise_to_strict_json_with_nan_and_inf() -> None:
    data = {M.GRAD_NORM: Series(M.GRAD_NORM, [0, 1, 2], [1.0, math.nan, math.inf])}
    for text in (  # as Dash sends the dict, and as plotly would send the validated figure
        to_json_plotly(F.panel_figure(PANELS_BY_KEY["grad"], data)),
        pio.to_json(panel_figure(PANELS_BY_KEY["grad"], data)),
    ):
        assert "NaN" not in text and "Infinity" not in text
        assert json.loads(text)["data"][0]["y"] == [1.0, None, None]


def test_empty_figure_says_why() -> None:
    fig = empty_figure("no data for reward/mean", title="Reward")
    assert fig.data == () and fig.layout.annotations[0].text == "no data for reward/mean"


ACTIONS: dict[str, list[Any]] = {
    "step": [5, 5, 5, 5, 7, 7, 7],
    "delta": [-0.5, 0.1, -0.2, 0.3, -1.0, -2.0, math.nan],
    "advantage": [1.0, 1.0, -1.0, 0.0, 1.0, 1.0, 1.0],
}


def test_action_step_picks_the_last_step_with_records_up_to_the_request() -> None:
    assert action_step(ACTIONS, 6) == 5 and action_step(ACTIONS, 100) == 7 and action_step(ACTIONS, None) == 7
    assert action_step(ACTIONS, 4) is None and action_step({"step": []}, 3) is None


def test_delta_histogram_splits_by_advantage_sign() -> None:
    fig = delta_histogram(ACTIONS, 5)
    names = [t.name for t in fig.data]
    assert names == ["A>0 (correct) n=2", "A<0 (incorrect) n=1", "A=0 n=1"]
    assert sorted(fig.data[0].x) == [-0.5, 0.1]
    assert "step 5" in fig.layout.meta["title"] and fig.layout.barmode == "overlay"
    assert delta_histogram(ACTIONS, None).layout.annotations[0].name == "empty-state"


def test_delta_quantiles_show_the_shift_over_steps() -> None:
    fig = delta_quantiles(ACTIONS)
    median = next(t for t in fig.data if t.name == "median")
    assert list(median.x) == [5, 7]
    assert median.y[0] == pytest.approx(-0.2) and median.y[1] == pytest.approx(-1.5)  # NaN ignored
    assert {t.name for t in fig.data} >= {"p10-p90", "p25-p75"}
    assert (
        delta_quantiles({"step": [], "delta": [], "advantage": []}).layout.annotations[0].name
        == "empty-state"
    )


def test_compare_figure_overlays_runs_by_step() -> None:
    runs = [
        CompareRun("grpo (#1)", series(M.GRAD_NORM, 30), collapse_step=20),
        CompareRun("grpo+llds (#2)", series(M.GRAD_NORM, 40)),
        CompareRun("imported (#3)", None),
    ]
    fig = compare_figure(M.GRAD_NORM, runs)
    assert [t.name for t in fig.data] == ["grpo (#1)", "grpo+llds (#2)"]
    assert fig.layout.yaxis.type == "log"
    assert [(s.name, s.x0) for s in fig.layout.shapes] == [("collapse:grpo (#1)", 20)]
    assert any("imported (#3)" in a.text for a in fig.layout.annotations)
    assert compare_figure(M.REWARD_MEAN, [CompareRun("a", None)]).layout.annotations[0].text == (
        "no data for reward/mean"
    )


def test_no_figure_draws_a_title_in_the_modebar_row() -> None:
    """Titles are the pages' HTML headings (the browser test measures them clear of the modebar); a
    figure's top margin is the modebar's row, and a title that depends on the data is plain text in
    `layout.meta`, never drawn."""
    deltas = PANELS_BY_KEY["deltas"]
    figures = {
        "panel": panel_figure(deltas, {M.DELTA_TRAJ_POS: series(M.DELTA_TRAJ_POS)}),
        "empty": empty_figure("no data", title="Share of A>0 responses <b>"),
        "histogram": delta_histogram(ACTIONS, 5),
        "quantiles": delta_quantiles(ACTIONS),
        "compare": compare_figure(M.GRAD_NORM, [CompareRun("a", series(M.GRAD_NORM))]),
    }
    for name, fig in figures.items():
        assert fig.layout.title.text is None, name
        assert fig.layout.margin.t == F.MODEBAR_ROW, name
    assert F.figure_title(F.empty_figure("no data", title="Share of A>0 responses <b>")) == (
        "Share of A>0 responses <b>"
    )
    assert F.figure_title(F.delta_histogram(ACTIONS, 5)) == "Action deltas D_action at step 5 (4 actions)"
    assert F.figure_title(F.delta_quantiles(ACTIONS)) == "D_action quantiles over steps (A>0 actions)"
    assert F.figure_title(F.panel_figure(deltas, {})) == ""  # the page writes the panel's title


def test_the_run_page_queries_only_canonical_metrics() -> None:
    assert set(PANEL_METRICS) <= set(M.CANONICAL_METRICS)
    assert {M.LOGP_POS, M.GRAD_NORM, M.RATIO_POS_MIN, M.LLDS_LAMBDA, M.TURNS_MEAN} <= set(PANEL_METRICS)
