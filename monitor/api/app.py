"""`create_app(settings)`: the FastAPI application with its database, services and metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import RedirectResponse
from prometheus_client import CollectorRegistry

from contracts.wire import API_PREFIX
from monitor.api.errors import install_error_handlers
from monitor.api.routes import ingest, ops, query, runs
from monitor.api.state import AppState
from monitor.api.wire import request_schemas
from monitor.config import Settings
from monitor.db.engine import make_engine
from monitor.db.migrate import current_revision, head_revision, upgrade
from monitor.services.auth import AuthService
from monitor.services.ingest import IngestService
from monitor.services.query import QueryService
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import runs as run_store
from monitor.telemetry import ServiceMetrics

log = logging.getLogger("lldmon")


class SchemaOutdated(RuntimeError):
    """The database schema is not at the migrations' head."""


def ensure_schema(settings: Settings, db: Database) -> None:
    """Upgrade an empty/outdated SQLite automatically; elsewhere fail fast with the command to run."""
    current = current_revision(db.engine)
    head = head_revision()
    if current == head:
        return
    if db.is_sqlite and settings.auto_upgrade:
        log.info("upgrading database schema %s -> %s", current, head)
        upgrade(settings.resolved_database_url())
        return
    raise SchemaOutdated(
        f"database schema is at {current or 'empty'}, code needs {head}: "
        f"run `lldmon db upgrade --database-url ...` first"
    )


def build_state(settings: Settings, registry: CollectorRegistry | None = None) -> AppState:
    """Open the database, check its schema and wire the services."""
    db = Database(make_engine(settings.resolved_database_url(), pool_size=settings.db_pool_size))
    try:
        ensure_schema(settings, db)
    except BaseException:
        db.dispose()
        raise
    return assemble_state(settings, db, registry or CollectorRegistry())


def assemble_state(settings: Settings, db: Database, registry: CollectorRegistry) -> AppState:
    """Wire the services around an open database (no I/O here)."""

    def runs_by_status() -> dict[str, int]:
        with db.read() as conn:
            return run_store.count_by_status(conn)

    telemetry = ServiceMetrics(registry, runs_by_status)
    run_service = RunService(db)
    return AppState(
        settings=settings,
        db=db,
        registry=registry,
        telemetry=telemetry,
        auth=AuthService(db),
        runs=run_service,
        ingest=IngestService(db, run_service, telemetry),
        query=QueryService(db, run_service),
    )


def create_app(settings: Settings, *, registry: CollectorRegistry | None = None) -> FastAPI:
    state = build_state(settings, registry)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        state.db.dispose()

    app = FastAPI(
        title="lldmon",
        version="0.1.0",
        description="Collapse diagnostics for GRPO training of tool-using LLM agents.",
        lifespan=lifespan,
    )
    app.state.lldmon = state
    install_error_handlers(app)
    for router in (runs.router, ingest.router, query.router):
        app.include_router(router, prefix=API_PREFIX)
    app.include_router(ops.router)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/docs")

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(request_schemas()["components"])
        app.openapi_schema = schema
    return app.openapi_schema
