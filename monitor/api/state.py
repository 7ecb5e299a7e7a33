"""Everything a request needs, built once by `create_app` and stored on `app.state.lldmon`."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Depends, Header, Request
from prometheus_client import CollectorRegistry

from monitor.alerting.sinks import Dispatcher
from monitor.config import Settings
from monitor.domain import Principal
from monitor.services.alerts import AlertService
from monitor.services.auth import AuthService
from monitor.services.detection import DetectionService
from monitor.services.ingest import IngestService
from monitor.services.query import QueryService
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.telemetry import ServiceMetrics


@dataclass(frozen=True)
class AppState:
    settings: Settings
    db: Database
    registry: CollectorRegistry
    telemetry: ServiceMetrics
    auth: AuthService
    runs: RunService
    ingest: IngestService
    query: QueryService
    detection: DetectionService
    alerts: AlertService
    dispatcher: Dispatcher


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.lldmon
    return state


def get_principal(
    state: AppState = Depends(get_state),
    authorization: str | None = Header(default=None, description="Bearer <token> when auth is on."),
) -> Principal:
    return state.auth.authenticate(authorization)
