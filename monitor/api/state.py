"""Request dependencies: the `Services` that `create_app` built (on `app.state.lldmon`) and the caller."""

from __future__ import annotations

from fastapi import Depends, Header, Request

from monitor.bootstrap import Services
from monitor.domain import Principal

AppState = Services
"""The name the routes use for `monitor.bootstrap.Services` (the dashboard uses Services itself)."""


def get_state(request: Request) -> Services:
    state: Services = request.app.state.lldmon
    return state


def get_principal(
    state: Services = Depends(get_state),
    authorization: str | None = Header(default=None, description="Bearer <token> when auth is on."),
) -> Principal:
    return state.auth.authenticate(authorization)
