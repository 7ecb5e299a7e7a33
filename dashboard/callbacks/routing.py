"""URL -> page. The page layouts are rendered per request, with the caller's Principal.

A run page is /run/<id>, /run/<name> or /run/<project>/<name> (percent-encoded as a browser sends it;
a name may hold "/"). Only runs the caller may see are found; a name that several of its projects use
gives a page linking each of them. Anything else in the URL is a 404 page, never an error.
"""

from __future__ import annotations

from urllib.parse import unquote

from dash import Dash, Input, Output, dcc, html
from dash.development.base_component import Component
from dash.exceptions import UnsupportedRelativePath

from dashboard import data, inputs
from dashboard.auth import can_steer, current_principal
from dashboard.callbacks.base import DashContext
from dashboard.callbacks.run_panels import overlay_of
from dashboard.layout import error_page
from dashboard.pages import compare as compare_page
from dashboard.pages import run as run_page
from dashboard.pages import runs as runs_page
from monitor.domain import Principal, RunInfo
from monitor.errors import InvalidInput, LLDMonError, NotFound
from monitor.surrogates import surrogates_escaped

SHOWN_CHARS = 120
"""Of a URL echoed in a 404 page."""


def _shown(text: str) -> str:
    text = surrogates_escaped(text)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def render_page(ctx: DashContext, principal: Principal, relative_path: str, search: object) -> Component:
    """`relative_path` is the path below the dashboard's prefix without slashes: "", "run/3", "compare"."""
    parts = [p for p in relative_path.split("/") if p]
    if not parts:
        return runs_page.layout(ctx.runs_refresh_ms)
    if parts[0] == "run" and len(parts) >= 2:
        return _run_page(ctx, principal, parts[1:])
    if parts == ["compare"]:
        run_ids, metrics = compare_page.parse_query(search)
        return compare_page.layout(run_ids, metrics, data.run_options(ctx.state, principal))
    return error_page("404", f"no page at /{_shown(relative_path)}", ctx.path_for)


def find_runs(ctx: DashContext, principal: Principal, parts: list[str]) -> list[RunInfo]:
    """Runs the URL's path segments after "run/" name: <project>/<name> first, else <name> in any
    project the principal sees."""
    names = [unquote(p) for p in parts]
    candidates: list[tuple[str | None, str]] = []
    if len(names) >= 2:
        candidates.append((names[0], "/".join(names[1:])))
    candidates.append((None, "/".join(names)))
    for project, name in candidates:
        try:
            inputs.text(name, "name")
            inputs.text(project, "project")
        except InvalidInput:
            continue  # no run can be named so: nothing to ask the database
        runs = data.runs_named(ctx.state, principal, name, project)
        if runs:
            return runs
    return []


def _run_page(ctx: DashContext, principal: Principal, parts: list[str]) -> Component:
    run_id = inputs.run_id_text(parts[0]) if len(parts) == 1 else None
    try:
        if run_id is not None:
            try:
                rc = data.run_context(ctx.state, principal, run_id)
            except NotFound:
                named = find_runs(ctx, principal, parts)  # a run whose name is digits
                if len(named) != 1:
                    raise
                rc = data.run_context(ctx.state, principal, named[0].id)
        else:
            named = find_runs(ctx, principal, parts)
            if len(named) != 1:
                return _not_one_run(ctx, "/".join(unquote(p) for p in parts), named)
            rc = data.run_context(ctx.state, principal, named[0].id)
    except LLDMonError as exc:
        return error_page(f"{exc.status_code}", exc.message, ctx.path_for)
    return run_page.layout(
        rc,
        overlay_of(rc),
        steer=can_steer(principal, rc.run),
        path_for=ctx.path_for,
        refresh_ms=ctx.run_refresh_ms,
    )


def _not_one_run(ctx: DashContext, name: str, runs: list[RunInfo]) -> Component:
    if not runs:
        return error_page("404", f"no run named {_shown(name)!r} that you can see", ctx.path_for)
    return html.Div(
        [
            html.H2(f"{len(runs)} runs are named {name!r}"),
            html.P("Pick one (or open /run/<project>/<name>):"),
            html.Ul(
                [
                    html.Li(dcc.Link(f"{r.project} / {r.name} (#{r.id})", href=ctx.path_for(f"/run/{r.id}")))
                    for r in runs
                ]
            ),
        ],
        className="card error-page",
        id="run-choices",
    )


def whoami(principal: Principal) -> str:
    return "auth off (local)" if principal.unrestricted else f"project {principal.project}"


def relative_path(app: Dash, pathname: object) -> str | None:
    """The path below the dashboard's prefix, or None for a pathname that is not one of its URLs."""
    if pathname is None:
        return ""
    if not isinstance(pathname, str):
        return None
    try:
        return app.strip_relative_path(pathname) or ""
    except UnsupportedRelativePath:
        return None


def register(app: Dash, ctx: DashContext) -> None:
    @app.callback(
        Output("page", "children"),
        Output("whoami", "children"),
        Input("url", "pathname"),
        Input("url", "search"),
    )
    def _route(pathname: object, search: object) -> tuple[Component, str]:
        principal = current_principal()
        relative = relative_path(app, pathname)
        if relative is None:
            page = error_page("404", "no dashboard page at this address", ctx.path_for)
        else:
            page = render_page(ctx, principal, relative, search)
        return page, whoami(principal)
