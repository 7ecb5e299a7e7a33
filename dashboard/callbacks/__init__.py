"""Dash callbacks, one small module per concern. Each module has pure-ish functions (services in, data or
figures out; testable without a browser) and a `register(app, ctx)` that wires them to components."""

from __future__ import annotations

from dash import Dash

from dashboard.callbacks import (
    actions,
    compare,
    directive,
    export,
    routing,
    run_panels,
    run_summary,
    runs_list,
)
from dashboard.callbacks.base import DashContext


def register_all(app: Dash, ctx: DashContext) -> None:
    for module in (routing, runs_list, run_panels, run_summary, actions, directive, export, compare):
        module.register(app, ctx)
