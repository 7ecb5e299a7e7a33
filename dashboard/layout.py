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

SERVER_WATCH_JS = """
(function () {
  // A page whose server is gone must say so, not show "running, seen 0 s ago" forever: poll the
  // dashboard's own layout endpoint; any HTTP answer but a gateway error means the server is there.
  var lostSince = null;
  function banner() { return document.getElementById('server-lost'); }
  function show(lost) {
    var el = banner();
    if (!el) return;
    if (lost) {
      if (lostSince === null) lostSince = new Date();
      el.textContent = 'Lost contact with the lldmon server since ' + lostSince.toLocaleTimeString() +
        ': what this page shows may be out of date. Retrying...';
      el.hidden = false;
    } else {
      lostSince = null;
      el.hidden = true;
    }
  }
  function check() {
    var config = document.getElementById('_dash-config');
    var prefix = '/';
    try { prefix = JSON.parse(config.textContent).requests_pathname_prefix || '/'; } catch (e) {}
    var ctl = new AbortController();
    var timer = setTimeout(function () { ctl.abort(); }, 4000);
    fetch(prefix + '_dash-layout', {cache: 'no-store', signal: ctl.signal, credentials: 'same-origin'})
      .then(function (r) { show(r.status >= 502 && r.status <= 504); })
      .catch(function () { show(true); })
      .finally(function () { clearTimeout(timer); });
  }
  setInterval(check, 2000);
})();
"""

INDEX_STRING = (
    f"""<!DOCTYPE html>
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
            <script>"""
    + SERVER_WATCH_JS
    + """</script>
        </footer>
    </body>
</html>"""
)


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
            html.Div(id="server-lost", className="server-lost", hidden=True, role="alert"),
            html.Main(id="page"),
        ]
    )


STATUS_COLORS = {"running": "#2e7d32", "stalled": "#ef6c00", "crashed": "#c62828", "failed": "#c62828"}


def status_badge(status: str, last_seen: datetime | None = None) -> html.Span:
    """The run's status, coloured so a stalled or crashed run stands out, with "last seen N ago"."""
    data_attrs: dict[str, Any] = {"data-status": status}
    seen = f", last seen {ago(last_seen)}" if last_seen is not None else ""
    return html.Span(
        status,
        className=f"badge status-{status}",
        style={"background": STATUS_COLORS.get(status, "#6a737d")},
        title=f"run status: {status}{seen}",
        **data_attrs,
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


def graph_card(title: str, graph: dcc.Graph, *, title_id: str | None = None, card: bool = True) -> html.Div:
    """`graph` under an HTML heading that holds its title (figures draw none: `dashboard.figures`). The
    heading wraps with the box's width, so a long title stays whole at any window width and never runs
    under the modebar plotly shows over the graph's top right corner. `card=False` for a graph inside a
    card of its own (no border within a border); `title_id` for a heading a callback rewrites."""
    heading_id: dict[str, Any] = {"id": title_id} if title_id is not None else {}
    return html.Div(
        [html.H4(title, className="graph-title", **heading_id), graph],
        className="graph-card card" if card else "graph-card",
    )


def error_page(title: str, message: str, path_for: PathFor) -> Component:
    return html.Div(
        [html.H2(title), html.P(message), dcc.Link("back to the runs", href=path_for("/"))],
        className="card error-page",
        id="error-page",
    )
