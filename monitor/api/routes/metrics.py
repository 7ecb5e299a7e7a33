"""A run's metric history (JSON or CSV, downsampled on request) and the names it logged."""

from __future__ import annotations

from typing import Annotated, Literal

import orjson
from fastapi import Depends, Query, Response
from pydantic import Field

from contracts.wire import encode_float
from monitor.api.params import NO_NUL, RunId
from monitor.api.routes._run import ERRORS, run_router
from monitor.api.schemas import HistoryOut, MetricNameOut
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import MAX_BIGINT, Principal

router = run_router()


@router.get("/metrics", response_model=HistoryOut, responses=ERRORS)
def metric_history(
    run_id: RunId,
    names: list[Annotated[str, Field(pattern=NO_NUL)]] | None = Query(
        None, description="Metric names; repeat the parameter. Default: all."
    ),
    step_min: int | None = Query(None, ge=0, le=MAX_BIGINT),
    step_max: int | None = Query(None, ge=0, le=MAX_BIGINT),
    max_points: int | None = Query(
        None, ge=1, le=100_000, description="Downsample each series (min/max buckets keep spikes)."
    ),
    format: Literal["json", "csv"] = "json",
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """History of a run's metrics. Non-finite values are the strings 'NaN', 'Infinity', '-Infinity'."""
    series = state.query.history(principal, run_id, names, step_min, step_max, max_points)
    if format == "csv":
        return Response(
            state.query.history_csv(series),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="run-{run_id}-metrics.csv"'},
        )
    payload = {
        "run_id": run_id,
        "series": {s.name: {"steps": s.steps, "values": [encode_float(v) for v in s.values]} for s in series},
    }
    return Response(orjson.dumps(payload), media_type="application/json")


@router.get("/metric-names", response_model=list[MetricNameOut], responses=ERRORS)
def metric_names(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> list[MetricNameOut]:
    return [
        MetricNameOut(name=m.name, points=m.points, first_step=m.first_step, last_step=m.last_step)
        for m in state.query.metric_names(principal, run_id)
    ]
