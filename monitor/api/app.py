"""`create_app(settings)`: the FastAPI application with its database, services and metrics."""

from __future__ import annotations

import importlib.metadata
import logging
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
from monitor.alerting.sinks import Dispatcher, Sink, build_sinks
from monitor.api.body import BodyLimitMiddleware
from monitor.api.errors import install_error_handlers
from monitor.api.routes import ingest, ops, query, runs
from monitor.api.state import AppState
from monitor.api.wire import request_schemas
from monitor.config import Settings
from monitor.db.engine import make_engine
from monitor.db.migrate import current_revision, head_revision, upgrade
from monitor.services.alerts import AlertService, DeliveryLog
from monitor.services.auth import AuthService
from monitor.services.detection import DetectionService
from monitor.services.ingest import IngestService
from monitor.services.liveness import LivenessService, Sweeper
from monitor.services.query import QueryService
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import alerts as alert_store
from monitor.store import runs as run_store
from monitor.telemetry import ServiceMetrics, Snapshot

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


def build_state(
    settings: Settings, registry: CollectorRegistry | None = None, http_client: httpx.Client | None = None
) -> AppState:
    """Open the database, check its schema and wire the services."""
    db = Database(make_engine(settings.resolved_database_url(), pool_size=settings.db_pool_size))
    try:
        ensure_schema(settings, db)
    except BaseException:
        db.dispose()
        raise
    return assemble_state(settings, db, registry or CollectorRegistry(), http_client)


def make_sinks(settings: Settings, client: httpx.Client | None) -> list[Sink]:
    return build_sinks(settings, client)


def assemble_state(
    settings: Settings, db: Database, registry: CollectorRegistry, http_client: httpx.Client | None = None
) -> AppState:
    """Wire the services around an open database (no I/O here); `http_client` carries webhooks."""

    def snapshot() -> Snapshot:
        with db.read() as conn:
            return Snapshot(
                runs_by_status=run_store.count_by_status(conn),
                running_phases=run_store.running_phases(conn),
                open_alerts_by_severity=alert_store.open_counts(conn),
            )

    telemetry = ServiceMetrics(registry, snapshot)
    run_service = RunService(db)
    dispatcher = Dispatcher(
        make_sinks(settings, http_client),
        telemetry,
        max_attempts=settings.sink_max_attempts,
        recorder=DeliveryLog(db),
        public_url=settings.public_url or f"http://{settings.host}:{settings.port}",
    )
    detection = DetectionService(db, run_service, settings, telemetry, dispatcher)
    return AppState(
        settings=settings,
        db=db,
        registry=registry,
        telemetry=telemetry,
        auth=AuthService(db),
        runs=run_service,
        ingest=IngestService(db, run_service, telemetry, detection),
        query=QueryService(db, run_service),
        detection=detection,
        alerts=AlertService(
            db, run_service, dispatcher, renotify_after=detection.renotify_after, telemetry=telemetry
        ),
        dispatcher=dispatcher,
    )


def create_app(
    settings: Settings, *, registry: CollectorRegistry | None = None, http_client: httpx.Client | None = None
) -> FastAPI:
    state = build_state(settings, registry, http_client)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        liveness = LivenessService(state.db, state.runs, state.alerts, settings)
        sweeper = Sweeper(liveness, settings.liveness_sweep_seconds)
        sweeper.start()
        yield
        sweeper.stop()
        state.dispatcher.close()
        state.db.dispose()

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
    for router in (runs.router, ingest.router, query.router):
        app.include_router(router, prefix=API_PREFIX)
    app.include_router(ops.router)

    mounted = mount_extensions(app, state)

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
    paths = []
    for entry_point in importlib.metadata.entry_points(group=MOUNTS_GROUP):
        paths.append(entry_point.load()(app, state))
    return paths


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(request_schemas()["components"])
        app.openapi_schema = schema
    return app.openapi_schema
