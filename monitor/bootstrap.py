"""`build_services(settings) -> Services`: the database, the services and their wiring, in one place.

Every entry point builds the same object: the HTTP API (`monitor.api.app.create_app` adapts HTTP to
it), the CLI, the demo, the dashboard (mounted with it) and the tests. Nothing here knows about HTTP.
`Services.close()` is the shutdown: stop the sinks' workers, then release the database.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry

from monitor.alerting.sinks import Dispatcher, build_sinks
from monitor.config import Settings
from monitor.db.engine import make_engine
from monitor.db.migrate import current_revision, head_revision, upgrade
from monitor.services.alerts import AlertService, DeliveryLog
from monitor.services.auth import AuthService
from monitor.services.detection import DetectionService
from monitor.services.directives import DirectiveService, rule_from
from monitor.services.ingest import IngestService
from monitor.services.liveness import LivenessService
from monitor.services.query import QueryService
from monitor.services.retention import RetentionService
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import alerts as alert_store
from monitor.store import runs as run_store
from monitor.telemetry import ServiceMetrics, Snapshot

if TYPE_CHECKING:
    from monitor.ports import DashboardPort, ServicePort

log = logging.getLogger("lldmon")


class SchemaOutdated(RuntimeError):
    """The database schema is not at the migrations' head."""


@dataclass(frozen=True)
class Services:
    """Everything a request, a command or a test needs, built once per process."""

    settings: Settings
    db: Database
    registry: CollectorRegistry
    telemetry: ServiceMetrics
    auth: AuthService
    runs: RunService
    ingest: IngestService
    query: QueryService
    directives: DirectiveService
    detection: DetectionService
    alerts: AlertService
    liveness: LivenessService
    retention: RetentionService
    dispatcher: Dispatcher

    def close(self) -> None:
        """Shutdown: let the sinks' workers finish what is queued, then close the database's pool."""
        try:
            self.dispatcher.close()
        finally:
            self.db.dispose()


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


def build_services(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    sink_transport: httpx.AsyncBaseTransport | None = None,
) -> Services:
    """Open the database, check its schema and wire the services (`SchemaOutdated` if it is behind)."""
    db = Database(make_engine(settings.resolved_database_url(), pool_size=settings.db_pool_size))
    try:
        ensure_schema(settings, db)
    except BaseException:
        db.dispose()
        raise
    return assemble_services(settings, db, registry or CollectorRegistry(), sink_transport)


def assemble_services(
    settings: Settings,
    db: Database,
    registry: CollectorRegistry,
    sink_transport: httpx.AsyncBaseTransport | None = None,
) -> Services:
    """Wire the services around an open database (no I/O here); `sink_transport` replaces the webhooks'
    network (tests)."""

    def snapshot() -> Snapshot:
        with db.read() as conn:
            return Snapshot(
                runs_by_status=run_store.count_by_status(conn),
                running_phases=run_store.running_phases(conn),
                open_alerts_by_severity=alert_store.open_counts(conn),
            )

    telemetry = ServiceMetrics(registry, snapshot)
    runs = RunService(db)
    dispatcher = Dispatcher(
        build_sinks(settings, sink_transport),
        telemetry,
        max_attempts=settings.sink_max_attempts,
        recorder=DeliveryLog(db),
        public_url=settings.public_url or f"http://{settings.host}:{settings.port}",
    )
    alerts = AlertService(
        db,
        runs,
        dispatcher,
        renotify_after=timedelta(seconds=settings.renotify_seconds),
        hold_steps=settings.alert_hold_steps,
        telemetry=telemetry,
    )
    directives = DirectiveService(db, runs, rule_from(settings))
    detection = DetectionService(db, runs, telemetry, alerts, directives)
    return Services(
        settings=settings,
        db=db,
        registry=registry,
        telemetry=telemetry,
        auth=AuthService(db),
        runs=runs,
        ingest=IngestService(db, runs, telemetry, detection),
        query=QueryService(db, runs),
        directives=directives,
        detection=detection,
        alerts=alerts,
        liveness=LivenessService(db, runs, alerts, settings),
        retention=RetentionService(db, runs),
        dispatcher=dispatcher,
    )


if TYPE_CHECKING:  # mypy holds the local services to the ports the commands and the dashboard use

    def _command_port(services: Services) -> ServicePort:
        return services

    def _dashboard_port(services: Services) -> DashboardPort:
        return services
