"""A run's directive (what its trainer should do: LLDS, checkpoint, rollback, stop) and its history."""

from __future__ import annotations

from fastapi import Depends

from monitor.api.params import RunId
from monitor.api.routes._run import ERRORS, run_router
from monitor.api.schemas import DirectiveIn, DirectiveOut
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import Principal

router = run_router()


@router.get("/directive", response_model=DirectiveOut, responses=ERRORS)
def get_directive(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> DirectiveOut:
    """What the trainer should do now (also returned with every ingest acknowledgement)."""
    return DirectiveOut.of(state.directives.current(principal, run_id))


@router.put("/directive", response_model=DirectiveOut, responses=ERRORS)
def set_directive(
    run_id: RunId,
    body: DirectiveIn,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> DirectiveOut:
    """Manual change, recorded as a new version with its reason: switch LLDS on/off and set lambda,
    request a checkpoint (`"checkpoint": true`; the trainer saves once per request), request a rollback
    (`"rollback": {"to_step": 96, "lr_scale": 0.5}`: the trainer restores its newest checkpoint at or
    before step 96 and continues, under `lldmon supervise`), request a graceful stop (`"stop": true`; `false` withdraws it) or opt in to a stop on collapse (`"stop_on_collapse"`).
    What the body leaves out keeps its value; the trainer acknowledges the version in its next batch."""
    directive = state.directives.set_manual(
        principal,
        run_id,
        llds_enabled=body.llds.enabled if body.llds is not None else None,
        lam=body.llds.lam if body.llds is not None else None,
        checkpoint=body.checkpoint,
        rollback_to=body.rollback.to_step if body.rollback is not None else None,
        lr_scale=body.rollback.lr_scale if body.rollback is not None else None,
        stop=body.stop,
        stop_on_collapse=body.stop_on_collapse,
        reason=body.reason,
    )
    return DirectiveOut.of(directive)


@router.get("/directives", response_model=list[DirectiveOut], responses=ERRORS)
def directive_history(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> list[DirectiveOut]:
    return [DirectiveOut.of(d) for d in state.directives.history(principal, run_id)]
