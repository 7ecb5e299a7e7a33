"""A run's alerts: list (with their delivery state per sink) and acknowledge."""

from __future__ import annotations

from typing import Literal

from fastapi import Depends

from monitor.api.params import AlertId, RunId
from monitor.api.routes._run import ERRORS, run_router
from monitor.api.schemas import AlertOut
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import Principal

router = run_router()


@router.get("/alerts", response_model=list[AlertOut], responses=ERRORS)
def list_alerts(
    run_id: RunId,
    status: Literal["open", "acknowledged", "resolved"] | None = None,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> list[AlertOut]:
    return [AlertOut.of(a) for a in state.alerts.list(principal, run_id, status)]


@router.post("/alerts/{alert_id}/ack", response_model=AlertOut, responses=ERRORS)
def acknowledge_alert(
    run_id: RunId,
    alert_id: AlertId,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> AlertOut:
    """Acknowledge an open alert: no more re-notifications; it still resolves when the run recovers."""
    return AlertOut.of(state.alerts.acknowledge(principal, run_id, alert_id))
