"""Request dependencies: the `Services` that `create_app` built (on `app.state.lldmon`) and the caller."""

from __future__ import annotations

from fastapi import Depends, Header, Request

from monitor.bootstrap import Services
from monitor.domain import Principal

AppState = Services
"""The name the routes use for `monitor.bootstrap.Services` (the dashboard uses Services itself)."""


async def get_state(request: Request) -> Services:
    """Async though it awaits nothing: FastAPI runs a plain `def` dependency in a worker thread, a
    thread hop on every request for an attribute read."""
    state: Services = request.app.state.lldmon
    return state


def get_principal(
    state: Services = Depends(get_state),
    authorization: str | None = Header(default=None, description="Bearer <token> when auth is on."),
) -> Principal:
    return state.auth.authenticate(authorization)
