"""Runs: register (get-or-create by project and name), get, list, finish, set directive policy;
liveness: heartbeat and per-run stall/crash thresholds."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from monitor.api.params import NO_NUL, NoNul, RunId
from monitor.api.schemas import PolicyIn, RunCreate, RunFinish, RunOut
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import MAX_BIGINT, Liveness, Principal, RunFilter
from monitor.services.liveness import MAX_THRESHOLD_S, LivenessService

router = APIRouter(prefix="/runs", tags=["runs"])


@router.post("", response_model=RunOut, status_code=201, responses={200: {"model": RunOut}})
def register_run(
    body: RunCreate,
    response: Response,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> RunOut:
    """Create a run, or return the existing run of that name in the project (status 200)."""
    run, created = state.runs.register(principal, body.name, body.project, body.config, body.tags)
    if not created:
        response.status_code = 200
    return RunOut.of(run)


@router.get("", response_model=list[RunOut])
def list_runs(
    project: NoNul | None = None,
    status: str | None = None,
    tag: NoNul | None = None,
    name: Annotated[str | None, Query(pattern=NO_NUL, description="Exact run name.")] = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_BIGINT),
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> list[RunOut]:
    flt = RunFilter(project=project, status=status, tag=tag, limit=limit, offset=offset, name=name)
    return [RunOut.of(r) for r in state.runs.list(principal, flt)]


@router.get("/{run_id}", response_model=RunOut)
def get_run(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> RunOut:
    return RunOut.of(state.runs.get(principal, run_id))


@router.post("/{run_id}/finish", response_model=RunOut)
def finish_run(
    run_id: RunId,
    body: RunFinish | None = None,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> RunOut:
    status = body.status if body is not None else "finished"
    state.runs.get(principal, run_id)  # access first: a stranger's request judges nothing
    state.ingest.judge_backlog(run_id)  # steps of a batch over the detector's per-batch bound
    finished = state.runs.finish(principal, run_id, status)
    state.liveness.finished(run_id)
    return RunOut.of(finished)


@router.put("/{run_id}/policy", response_model=RunOut)
def set_policy(
    run_id: RunId,
    body: PolicyIn,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> RunOut:
    """Directive policy: `off`, `alert` (default: alerts only) or `auto` (detector may switch LLDS on)."""
    return RunOut.of(state.runs.set_policy(principal, run_id, body.policy))


Seconds = Annotated[float | None, Field(gt=0, le=MAX_THRESHOLD_S, allow_inf_nan=False)]


class LivenessIn(BaseModel):
    """Seconds of silence (no batch, no heartbeat) before the run is `stalled` / `crashed`; null or
    absent: the service's default (scaled by the run's median step interval)."""

    model_config = ConfigDict(extra="forbid")

    stall_after_s: Seconds = None
    crash_after_s: Seconds = None


class LivenessOut(BaseModel):
    run_id: int
    status: str
    last_seen_at: datetime
    last_step_at: datetime | None
    silent_s: float
    stall_after_s: float | None = Field(description="Set on the run (null: default).")
    crash_after_s: float | None = Field(description="Set on the run (null: default).")
    effective_stall_after_s: float = Field(description="Threshold in force.")
    effective_crash_after_s: float = Field(description="Threshold in force.")
    median_step_s: float | None

    @classmethod
    def of(cls, live: Liveness) -> LivenessOut:
        return cls(**live.__dict__)


def get_liveness(state: AppState = Depends(get_state)) -> LivenessService:
    return state.liveness


@router.post("/{run_id}/heartbeat", response_model=LivenessOut)
def heartbeat(
    run_id: RunId,
    liveness: LivenessService = Depends(get_liveness),
    principal: Principal = Depends(get_principal),
) -> LivenessOut:
    """The job is alive between steps (no body): a stalled or crashed run is `running` again."""
    return LivenessOut.of(liveness.heartbeat(principal, run_id))


@router.get("/{run_id}/liveness", response_model=LivenessOut)
def get_run_liveness(
    run_id: RunId,
    liveness: LivenessService = Depends(get_liveness),
    principal: Principal = Depends(get_principal),
) -> LivenessOut:
    return LivenessOut.of(liveness.get(principal, run_id))


@router.put("/{run_id}/liveness", response_model=LivenessOut)
def set_run_liveness(
    run_id: RunId,
    body: LivenessIn,
    liveness: LivenessService = Depends(get_liveness),
    principal: Principal = Depends(get_principal),
) -> LivenessOut:
    """Per-run thresholds (`{"stall_after_s": 600, "crash_after_s": 3600}`); null resets to the default."""
    return LivenessOut.of(liveness.set_thresholds(principal, run_id, body.stall_after_s, body.crash_after_s))
