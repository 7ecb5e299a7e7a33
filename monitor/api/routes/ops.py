"""Liveness, readiness and Prometheus metrics, for probes and scrapers: no project token needed, but
/metrics takes its own scrape token when `LLDMON_METRICS_TOKEN` is set (its series carry run names)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends, Header, Response
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
def prometheus_metrics(
    state: AppState = Depends(get_state),
    authorization: str | None = Header(default=None, description="Bearer <LLDMON_METRICS_TOKEN>, if set."),
) -> Response:
    expected = state.settings.metrics_token
    if expected is not None:
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), expected.get_secret_value().encode()):
            return JSONResponse(
                {"error": {"code": "unauthorized", "message": "GET /metrics needs the scrape token"}},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
