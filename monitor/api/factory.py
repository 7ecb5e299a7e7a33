"""Zero-argument app factory for multi-worker uvicorn (`lldmon serve --workers N`): settings from env."""

from __future__ import annotations

from fastapi import FastAPI

from monitor.api.app import create_app
from monitor.config import Settings


def app() -> FastAPI:
    return create_app(Settings())
