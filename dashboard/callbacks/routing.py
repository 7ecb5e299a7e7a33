"""URL -> page. The page layouts are rendered per request, with the caller's Principal."""

from __future__ import annotations

from dash import Dash, Input, Output
from dash.development.base_component import Component

from dashboard import data
from dashboard.auth import can_steer, current_principal
from dashboard.callbacks.base import DashContext
from dashboard.layout import error_page
from dashboard.pages import compare as compare_page
from dashboard.pages import run as run_page
from dashboard.pages import runs as runs_page
from monitor.domain import Principal
from monitor.errors import LLDMonError


def render_page(ctx: DashContext, principal: Principal, relative_path: str, search: str | None) -> Component:
    """`relative_path` is the path below the dashboard's prefix without slashes: "", "run/3", "compare"."""
    parts = [p for p in relative_path.split("/") if p]
    if not parts:
        return runs_page.layout(ctx.runs_refresh_ms)
    if parts[0] == "run" and len(parts) == 2 and parts[1].isdigit():
        run_id = int(parts[1])
        try:
            run = ctx.state.runs.get(principal, run_id)
            directive = ctx.state.query.directive(principal, run_id)
        except LLDMonError as exc:
            return error_page(f"{exc.status_code}", exc.message, ctx.path_for)
        return run_page.layout(
            run,
            directive,
            steer=can_steer(principal, run),
            path_for=ctx.path_for,
            refresh_ms=ctx.run_refresh_ms,
        )
    if parts == ["compare"]:
        run_ids, metrics = compare_page.parse_query(search)
        return compare_page.layout(run_ids, metrics, data.run_options(ctx.state, principal))
    return error_page("404", f"no page at /{relative_path}", ctx.path_for)


def whoami(principal: Principal) -> str:
    return "auth off (local)" if principal.unrestricted else f"project {principal.project}"


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("page", "children"),
        Output("whoami", "children"),
        Input("url", "pathname"),
        Input("url", "search"),
    )
    def _route(pathname: str | None, search: str | None) -> tuple[Component, str]:
        principal = current_principal()
        relative = app.strip_relative_path(pathname or "") or ""
        return render_page(ctx, principal, relative, search), whoami(principal)
