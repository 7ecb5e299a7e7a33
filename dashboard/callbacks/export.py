"""Export the run's metrics as CSV (same content as GET /api/v1/runs/{id}/metrics?format=csv), through
dcc.Download so the dashboard's own auth applies (a plain link could not carry the bearer token)."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, no_update

from dashboard import inputs
from dashboard.auth import current_principal
from dashboard.callbacks.base import DashContext
from monitor.domain import Principal
from monitor.errors import LLDMonError


def export_csv(ctx: DashContext, principal: Principal, run_id: object) -> dict[str, Any]:
    run_id = inputs.run_id(run_id)
    series = ctx.state.query.history(principal, run_id, None)
    csv = ctx.state.query.history_csv(series)
    return {"content": csv, "filename": f"run-{run_id}-metrics.csv", "type": "text/csv", "base64": False}


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("run-download", "data"),
        Input("export-csv", "n_clicks"),
        State("run-id", "data"),
        prevent_initial_call=True,
    )
    def _export(n_clicks: object, run_id: object) -> Any:
        if not n_clicks:
            return no_update
        try:
            return export_csv(ctx, current_principal(), run_id)
        except LLDMonError:
            return no_update
