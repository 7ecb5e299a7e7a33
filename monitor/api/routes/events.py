"""A run's phase changes (healthy, stagnation, decay, collapse) with their evidence, its rollbacks, and
the run at a glance."""

from __future__ import annotations

from fastapi import Depends

from monitor.api.params import RunId
from monitor.api.routes._run import ERRORS, run_router
from monitor.api.schemas import PhaseEventOut, RollbackOut, RunSummaryOut
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import Principal

router = run_router()


@router.get("/events", response_model=list[PhaseEventOut], responses=ERRORS)
def list_phase_events(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> list[PhaseEventOut]:
    """Phase changes of the run with their evidence."""
    return [PhaseEventOut.of(e) for e in state.query.phase_events(principal, run_id)]


@router.get("/rollbacks", response_model=list[RollbackOut], responses=ERRORS)
def list_rollbacks(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> list[RollbackOut]:
    """Rollbacks the run's trainer carried out, oldest first: which steps were undone and redone."""
    return [RollbackOut.of(r) for r in state.query.rollbacks(principal, run_id)]


@router.get("/summary", response_model=RunSummaryOut, responses=ERRORS)
def run_summary(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> RunSummaryOut:
    """The run at a glance: step extent, each metric's last value, phases, alerts, directives (what
    `lldmon runs show` prints; one read transaction, no metric history)."""
    return RunSummaryOut.of(state.query.summary(principal, run_id))
