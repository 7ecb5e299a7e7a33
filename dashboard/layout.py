"""The page shell (top bar, URL, page slot) and small shared components."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from dash import dcc, html
from dash.development.base_component import Component

from dashboard.theme import PHASE_COLORS, STYLESHEET

PathFor = Callable[[str], str]
"""Maps an app-relative path ("/run/3") to the browser's URL ("/dashboard/run/3")."""

INDEX_STRING = f"""<!DOCTYPE html>
<html>
    <head>
        {{%metas%}}
        <title>{{%title%}}</title>
        {{%favicon%}}
        {{%css%}}
        <style>{STYLESHEET}</style>
    </head>
    <body>
        {{%app_entry%}}
        <footer>
            {{%config%}}
            {{%scripts%}}
            {{%renderer%}}
        </footer>
    </body>
</html>"""


def shell(path_for: PathFor) -> Component:
    return html.Div(
        [
            dcc.Location(id="url", refresh=False),
            html.Nav(
                [
                    dcc.Link("lldmon", href=path_for("/"), className="brand"),
                    dcc.Link("Runs", href=path_for("/")),
                    dcc.Link("Compare", href=path_for("/compare")),
                    html.Span(id="whoami", className="who"),
                ],
                className="topbar",
            ),
            html.Main(id="page"),
        ]
    )


def phase_badge(phase: str | None) -> html.Span:
    name = phase or "warmup"
    data_attrs: dict[str, Any] = {"data-phase": name}
    return html.Span(
        name,
        className=f"badge phase-{name}",
        style={"background": PHASE_COLORS.get(name, "#9e9e9e")},
        title=f"detector phase: {name}",
        **data_attrs,
    )


def tag_list(tags: list[str]) -> list[html.Span]:
    return [html.Span(t, className="tag") for t in tags]


def ago(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return "-"
    now = now or datetime.now(timezone.utc)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    seconds = max(0, int((now - moment).total_seconds()))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def error_page(title: str, message: str, path_for: PathFor) -> Component:
    return html.Div(
        [html.H2(title), html.P(message), dcc.Link("back to the runs", href=path_for("/"))],
        className="card error-page",
        id="error-page",
    )
