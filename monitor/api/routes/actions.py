"""A run's action records (the per-token records behind the LLD diagnostics)."""

from __future__ import annotations

from typing import Literal

import orjson
from fastapi import Depends, Query, Response

from contracts.wire import encode_float
from monitor.api.params import MAX_BIGINT, RunId
from monitor.api.routes._run import ERRORS, run_router
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import Principal

router = run_router()


@router.get("/actions", responses=ERRORS)
def action_records(
    run_id: RunId,
    step_min: int | None = Query(None, ge=0, le=MAX_BIGINT),
    step_max: int | None = Query(None, ge=0, le=MAX_BIGINT),
    source: Literal["loss", "probe"] | None = None,
    limit: int = Query(50_000, ge=1, le=200_000),
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """Action records as columns (the ingest wire format's shape)."""
    columns = state.query.actions(principal, run_id, step_min, step_max, source, limit)
    for name in ("delta", "old_logp_mean", "advantage", "reward"):
        columns[name] = [encode_float(v) for v in columns[name]]
    return Response(orjson.dumps({"run_id": run_id, **columns}), media_type="application/json")
