"""Liveness, readiness and Prometheus metrics (unauthenticated, for probes and scrapers)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from monitor.api.state import AppState, get_state

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(state: AppState = Depends(get_state)) -> JSONResponse:
    """The database is reachable (503 otherwise, so load balancers stop routing here)."""
    if state.db.ping():
        return JSONResponse({"status": "ready", "database": "ok"})
    return JSONResponse({"status": "unavailable", "database": "unreachable"}, status_code=503)


@router.get("/metrics", response_class=Response)
def prometheus_metrics(state: AppState = Depends(get_state)) -> Response:
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
