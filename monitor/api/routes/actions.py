"""A run's action records (the per-token records behind the LLD diagnostics) and their per-step quantiles."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson
from fastapi import Depends, Query, Response

from contracts.action_pages import MAX_ACTION_READ, ActionCursor
from contracts.wire import ACTION_FLOAT_COLUMNS, encode_float
from monitor.api.params import RunId
from monitor.api.routes._run import ERRORS, run_router
from monitor.api.schemas import ActionSummariesOut
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import MAX_BIGINT, Principal
from monitor.errors import InvalidInput

router = run_router()
_AFTER = "With the other three after_* parameters: only the records after this key (the next page)."


@router.get("/actions", responses=ERRORS)
def action_records(
    run_id: RunId,
    step_min: int | None = Query(None, ge=0, le=MAX_BIGINT),
    step_max: int | None = Query(None, ge=0, le=MAX_BIGINT),
    source: Literal["loss", "probe"] | None = None,
    limit: int = Query(50_000, ge=1, le=MAX_ACTION_READ),
    after_step: int | None = Query(None, ge=0, le=MAX_BIGINT, description=_AFTER),
    after_source: Literal["loss", "probe"] | None = Query(None, description=_AFTER),
    after_traj_index: int | None = Query(None, ge=-MAX_BIGINT - 1, le=MAX_BIGINT, description=_AFTER),
    after_action_index: int | None = Query(None, ge=-MAX_BIGINT - 1, le=MAX_BIGINT, description=_AFTER),
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """Action records as columns (the ingest wire format's shape), in key order (step, source,
    traj_index, action_index), at most `limit`. The `after_*` cursor (the key of the last record of the
    previous page) reads on from there, also inside a step, so a step of any size reads in pages.
    Steps pruned by retention have none."""
    after = _cursor(after_step, after_source, after_traj_index, after_action_index)
    columns = state.query.actions(principal, run_id, step_min, step_max, source, limit, after)
    for name in ACTION_FLOAT_COLUMNS:
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


def _cursor(
    step: int | None, source: str | None, traj_index: int | None, action_index: int | None
) -> ActionCursor | None:
    """The `after_*` parameters as a cursor: all four or none."""
    if step is None and source is None and traj_index is None and action_index is None:
        return None
    if step is None or source is None or traj_index is None or action_index is None:
        raise InvalidInput(
            "after_step, after_source, after_traj_index and after_action_index go together (the key of "
            "the last record read)",
            field="after_step",
        )
    return ActionCursor(step, source, traj_index, action_index)


def _wire_rows(rows: Sequence[Sequence[float]]) -> list[list[Any]]:
    return [[encode_float(float(v)) for v in row] for row in rows]
