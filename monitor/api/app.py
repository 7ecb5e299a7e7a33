"""`create_app(settings)`: the FastAPI application: HTTP adapted onto the `Services` of `monitor.bootstrap`."""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import RedirectResponse
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry

from contracts.wire import API_PREFIX
from monitor.api.body import BodyLimitMiddleware
from monitor.api.errors import install_error_handlers
from monitor.api.routes import actions, alerts, detector, directives, events, ingest, metrics, ops, runs
from monitor.api.wire import request_schemas
from monitor.bootstrap import SchemaOutdated, Services, assemble_services, build_services, ensure_schema
from monitor.config import Settings
from monitor.services.liveness import Sweeper
from monitor.services.retention import Pruner

__all__ = ["AppState", "SchemaOutdated", "assemble_state", "build_state", "create_app", "ensure_schema"]

AppState = Services
build_state = build_services
"""Aliases kept for the CLI, scripts and tests: the wiring lives in `monitor.bootstrap`."""
assemble_state = assemble_services

ROUTERS = (
    runs.router,
    ingest.router,
    metrics.router,
    actions.router,
    directives.router,
    alerts.router,
    detector.router,
    events.router,
)
"""The API's routers, mounted under `API_PREFIX` in this order (it is the OpenAPI document's order)."""


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    sink_transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    state = build_services(settings, registry, sink_transport)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        sweeper = Sweeper(state.liveness, settings.liveness_sweep_seconds)
        sweeper.start()
        pruner = None
        if settings.actions_retention is not None:
            pruner = Pruner(state.retention, settings.actions_retention, settings.actions_prune_seconds)
            pruner.start()
        _app.state.pruner = pruner  # what tests and operators inspect: None when retention is off
        yield
        if pruner is not None:
            pruner.stop()
        sweeper.stop()
        state.close()

    # /docs and /redoc with Swagger UI and ReDoc served from the package (fastapi-offline ships them):
    # FastAPI's own pages load them from a CDN and are blank on an air-gapped cluster.
    app = FastAPIOffline(
        title="lldmon",
        version="0.1.0",
        description="Collapse diagnostics for GRPO training of tool-using LLM agents.",
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from validator.swagger.io
    )
    app.state.lldmon = state
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    for router in ROUTERS:
        app.include_router(router, prefix=API_PREFIX)
    app.include_router(ops.router)

    mounted = mount_extensions(app, state)
    app.state.mounted = mounted  # the UI paths, for `serve` to announce with its URL

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(mounted[0] if mounted else "/docs")

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


MOUNTS_GROUP = "lldmon.mounts"


def mount_extensions(app: FastAPI, state: AppState) -> list[str]:
    """Mount installed UI extensions (the dashboard) found through the `lldmon.mounts` entry points.

    Each entry point is `mount(app, state) -> path`. Going through entry points keeps `monitor` free
    of imports of `dashboard`: the dependency points from the UI to the service, never back.
    """
    return [entry_point.load()(app, state) for entry_point in _mount_entry_points()]


@functools.cache
def _mount_entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    """Looked up once per process: scanning every installed distribution's metadata takes about 15 ms,
    and an app is built per worker (per test in the suite); what is installed does not change under a
    running process."""
    return tuple(importlib.metadata.entry_points(group=MOUNTS_GROUP))


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(request_schemas()["components"])
        app.openapi_schema = schema
    return app.openapi_schema
