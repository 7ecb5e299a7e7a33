"""`create_dash_app(state)`: the Dash app, reading through monitor's services on `DashboardPort`.

`lldmon serve` mounts it under /dashboard on the API's port (see `dashboard.mount`): the mount strips
the prefix (WSGI SCRIPT_NAME), so Flask routes at "/" while the browser requests `url_base_pathname`.
"""

from __future__ import annotations

import dash

from dashboard.auth import install_auth
from dashboard.callbacks import register_all
from dashboard.callbacks.base import DashContext
from dashboard.layout import INDEX_STRING, shell
from dashboard.pages import run as run_page
from dashboard.pages import runs as runs_page
from monitor.ports import DashboardPort


def create_dash_app(
    state: DashboardPort,
    *,
    url_base_pathname: str = "/dashboard/",
    run_refresh_ms: int = run_page.REFRESH_MS,
    runs_refresh_ms: int = runs_page.REFRESH_MS,
) -> dash.Dash:
    """The dashboard as a Dash app whose Flask server (`.server`) expects to be mounted at the prefix."""
    if not (url_base_pathname.startswith("/") and url_base_pathname.endswith("/")):
        raise ValueError("url_base_pathname must start and end with '/'")
    app = dash.Dash(
        __name__,
        requests_pathname_prefix=url_base_pathname,
        routes_pathname_prefix="/",
        title="lldmon",
        update_title="",
        suppress_callback_exceptions=True,
        compress=False,
        index_string=INDEX_STRING,
    )
    ctx = DashContext(
        state=state,
        path_for=app.get_relative_path,
        run_refresh_ms=run_refresh_ms,
        runs_refresh_ms=runs_refresh_ms,
    )
    app.layout = shell(ctx.path_for)
    install_auth(app.server, state, cookie_path=url_base_pathname)
    register_all(app, ctx)
    return app
