"""Colours and the page stylesheet (inlined into Dash's index page: no asset files to package)."""

from __future__ import annotations

from typing import Final

from monitor.detector.types import COLLAPSE, DECAY, HEALTHY, NOT_LEARNING, STAGNATION, WARMUP

PHASE_COLORS: Final[dict[str, str]] = {
    WARMUP: "#9e9e9e",
    HEALTHY: "#2e7d32",
    STAGNATION: "#f9a825",
    DECAY: "#ef6c00",
    COLLAPSE: "#c62828",
    NOT_LEARNING: "#ffb300",
}
"""Badge and band colour of each detector phase (docs/science.md section 3)."""

BANDED_PHASES: Final = (STAGNATION, DECAY, COLLAPSE, NOT_LEARNING)
"""Phases shaded behind the time series (I, II, III, and a run that never learned, in amber)."""

BAND_OPACITY: Final = 0.16
SEVERITY_COLORS: Final[dict[str, str]] = {"info": "#607d8b", "warning": "#ef6c00", "critical": "#c62828"}
DIRECTIVE_COLORS: Final[dict[bool, str]] = {True: "#1565c0", False: "#616161"}
PHASE_MARKER_COLOR: Final = "#6a1b9a"
"""Colour of a phase-change marker whose phase has no colour of its own."""
ROLLBACK_COLOR: Final = "#6f42c1"
"""A rollback's marker (at the restored step)."""
MARKER_SYMBOLS: Final[dict[str, str]] = {
    "phase": "line-ns-open",
    "alert": "triangle-up",
    "directive": "diamond",
    "rollback": "triangle-left",
}
"""Plotly marker symbol of each marker group drawn on the run-page panels."""
SYMBOL_GLYPHS: Final[dict[str, str]] = {
    "line-ns-open": "│",
    "triangle-up": "▲",
    "diamond": "◆",
    "triangle-left": "◀",
}
"""The same symbols as text, for the run page's legend."""
SERIES_COLORS: Final = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf")
"""Trace colours in panel order (first metric blue, second red, ...)."""

STYLESHEET: Final = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; background: #f6f7f9;
       color: #1f2328; font-size: 14px; }
a { color: #0b5cad; text-decoration: none; } a:hover { text-decoration: underline; }
.topbar { display: flex; align-items: center; gap: 18px; padding: 10px 20px; background: #1f2933; color: #fff; }
.topbar a { color: #dbe4ee; font-weight: 500; } .topbar .brand { color: #fff; font-weight: 700; font-size: 17px; }
.topbar .who { margin-left: auto; color: #aab7c4; font-size: 12px; }
main { padding: 16px 20px 40px; }
.card { background: #fff; border: 1px solid #e1e4e8; border-radius: 8px; padding: 12px 14px; margin-bottom: 14px; }
.card h3 { margin: 0 0 8px; font-size: 15px; }
.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; }
.filters > * { min-width: 170px; }
table.grid { border-collapse: collapse; width: 100%; background: #fff; }
table.grid th, table.grid td { border-bottom: 1px solid #eceff3; padding: 6px 8px; text-align: left;
                               vertical-align: top; }
table.grid th { background: #f0f2f5; font-weight: 600; font-size: 13px; }
.badge { display: inline-block; padding: 2px 9px; border-radius: 10px; color: #fff; font-size: 12px;
         font-weight: 600; }
.badge.phase-stagnation { color: #1f2328; }
.server-lost { position: sticky; top: 0; z-index: 1000; background: #c62828; color: #fff;
               padding: 8px 16px; font-weight: 600; }
.server-lost[hidden] { display: none; }
.tag { display: inline-block; background: #e8eef6; color: #33475b; border-radius: 4px; padding: 1px 6px;
       margin-right: 4px; font-size: 12px; }
.muted { color: #6a737d; }
.panels { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 12px; }
.panels .card { padding: 4px 6px; margin: 0; }
.graph-card { min-width: 0; }
.graph-title { margin: 4px 6px 0; font-size: 14px; font-weight: 600; line-height: 1.35;
               overflow-wrap: anywhere; }
.runhead { display: flex; flex-wrap: wrap; gap: 16px; align-items: center; }
.runhead h2 { margin: 0; font-size: 20px; }
.controls { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; }
.controls > button, .btn { background: #0b5cad; color: #fff; border: 0; border-radius: 5px; padding: 6px 12px;
                         cursor: pointer; font-size: 13px; }
.controls > button.off { background: #616161; }
.controls label, .filters label { display: inline-flex; align-items: center; gap: 6px; }
.msg { font-size: 13px; }
.msg.err { color: #c62828; }
details summary { cursor: pointer; color: #0b5cad; }
pre.evidence { white-space: pre-wrap; font-size: 12px; margin: 4px 0; max-width: 720px; }
ul.explanation { margin: 4px 0; padding-left: 18px; font-size: 12px; max-width: 720px; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center; font-size: 12px; }
.legend .item { display: inline-flex; align-items: center; gap: 5px; }
.legend .swatch { display: inline-block; width: 22px; height: 12px; border-radius: 2px; }
.legend .glyph { font-size: 15px; line-height: 1; width: 16px; text-align: center; }
.legend .head { font-weight: 600; }
.error-page { max-width: 640px; margin: 60px auto; }
"""
