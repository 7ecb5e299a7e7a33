"""The dashboard as a WSGI callable for `create_app` to mount (a2wsgi) under /dashboard.

Dash (and plotly, pandas) are imported and the app is built on the first dashboard request, so creating
the API (every test, every worker) stays as fast as before and an API-only process never loads them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from monitor.ports import DashboardPort

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

URL_PREFIX = "/dashboard"


class LazyDashboard:
    """A WSGI app that builds `create_dash_app(state)` once, on its first request (thread-safe)."""

    def __init__(self, state: DashboardPort, url_base_pathname: str = URL_PREFIX + "/") -> None:
        self.state = state
        self.url_base_pathname = url_base_pathname
        self._app: WSGIApp | None = None
        self._lock = threading.Lock()

    def wsgi(self) -> WSGIApp:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    from dashboard.app import create_dash_app

                    self._app = create_dash_app(self.state, url_base_pathname=self.url_base_pathname).server
        return self._app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        return self.wsgi()(environ, start_response)


def dashboard_wsgi(state: DashboardPort) -> LazyDashboard:
    return LazyDashboard(state)


def mount(app: FastAPI, state: DashboardPort) -> str:
    """The `lldmon.mounts` entry point: serve the dashboard under /dashboard of the API's port.

    `monitor` finds this through the entry point instead of importing `dashboard` (the service
    package must not depend on its UI); returns the mounted path for the root redirect.
    """
    from a2wsgi import WSGIMiddleware

    app.mount(URL_PREFIX, WSGIMiddleware(dashboard_wsgi(state)))  # type: ignore[arg-type]
    return URL_PREFIX + "/"
