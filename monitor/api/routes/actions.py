"""A run's action records (the per-token records behind the LLD diagnostics) and their per-step quantiles."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson
from fastapi import Depends, Query, Response

from contracts.action_pages import MAX_ACTION_READ
from contracts.wire import encode_float
from monitor.api.params import MAX_BIGINT, RunId
from monitor.api.routes._run import ERRORS, run_router
from monitor.api.schemas import ActionSummariesOut
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import Principal

router = run_router()


@router.get("/actions", responses=ERRORS)
def action_records(
    run_id: RunId,
    step_min: int | None = Query(None, ge=0, le=MAX_BIGINT),
    step_max: int | None = Query(None, ge=0, le=MAX_BIGINT),
    source: Literal["loss", "probe"] | None = None,
    limit: int = Query(50_000, ge=1, le=MAX_ACTION_READ),
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """Action records as columns (the ingest wire format's shape). Steps pruned by retention have none."""
    columns = state.query.actions(principal, run_id, step_min, step_max, source, limit)
    for name in ("delta", "old_logp_mean", "advantage", "reward"):
        columns[name] = [encode_float(v) for v in columns[name]]
    return Response(orjson.dumps({"run_id": run_id, **columns}), media_type="application/json")


@router.get("/actions/summary", response_model=ActionSummariesOut, responses=ERRORS)
def action_summaries(
    run_id: RunId,
    step_min: int | None = Query(None, ge=0, le=MAX_BIGINT),
    step_max: int | None = Query(None, ge=0, le=MAX_BIGINT),
    source: Literal["loss", "probe"] | None = None,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """Per-step quantiles of the action deltas (stored with each step's block, so reading 500 steps decodes
    no records), also for steps whose raw records retention pruned. Non-finite as 'NaN', ..."""
    s = state.query.action_summaries(principal, run_id, step_min, step_max, source)
    payload = {
        "run_id": run_id,
        "steps": s.steps,
        "sources": s.sources,
        "levels": list(s.levels),
        "n_all": s.n_all,
        "q_all": _wire_rows(s.q_all),
        "n_pos": s.n_pos,
        "q_pos": _wire_rows(s.q_pos),
        "pruned": s.pruned,
    }
    return Response(orjson.dumps(payload), media_type="application/json")


def _wire_rows(rows: Sequence[Sequence[float]]) -> list[list[Any]]:
    return [[encode_float(float(v)) for v in row] for row in rows]
