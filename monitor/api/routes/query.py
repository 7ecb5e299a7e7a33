"""Read side of a run: metric history (JSON/CSV), metric names, actions, directive, alerts, events."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Response
from pydantic import Field

from contracts.wire import encode_float
from monitor.api.params import MAX_BIGINT, NO_NUL, AlertId, RunId
from monitor.api.schemas import (
    AlertOut,
    DetectorOverridesIn,
    DirectiveIn,
    DirectiveOut,
    ErrorOut,
    HistoryOut,
    MetricNameOut,
    PhaseEventOut,
)
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import Principal

router = APIRouter(prefix="/runs/{run_id}", tags=["query"])

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 403, 404, 422)}


@router.get("/metrics", response_model=HistoryOut, responses=_ERRORS)
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


@router.get("/metric-names", response_model=list[MetricNameOut], responses=_ERRORS)
def metric_names(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> list[MetricNameOut]:
    return [
        MetricNameOut(name=m.name, points=m.points, first_step=m.first_step, last_step=m.last_step)
        for m in state.query.metric_names(principal, run_id)
    ]


@router.get("/actions", responses=_ERRORS)
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


@router.get("/directive", response_model=DirectiveOut, responses=_ERRORS)
def get_directive(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> DirectiveOut:
    """What the trainer should do now (also returned with every ingest acknowledgement)."""
    return DirectiveOut.of(state.query.directive(principal, run_id))


@router.put("/directive", response_model=DirectiveOut, responses=_ERRORS)
def set_directive(
    run_id: RunId,
    body: DirectiveIn,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> DirectiveOut:
    """Manual change, recorded as a new version with its reason: switch LLDS on/off and set lambda,
    request a checkpoint (`"checkpoint": true`; the trainer saves once per request), request a graceful
    stop (`"stop": true`; `false` withdraws it) or opt in to a stop on collapse (`"stop_on_collapse"`).
    What the body leaves out keeps its value; the trainer acknowledges the version in its next batch."""
    directive = state.query.set_directive(
        principal,
        run_id,
        llds_enabled=body.llds.enabled if body.llds is not None else None,
        llds_lambda=body.llds.lam if body.llds is not None else None,
        checkpoint=body.checkpoint,
        stop=body.stop,
        stop_on_collapse=body.stop_on_collapse,
        reason=body.reason,
    )
    return DirectiveOut.of(directive)


@router.get("/directives", response_model=list[DirectiveOut], responses=_ERRORS)
def directive_history(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> list[DirectiveOut]:
    return [DirectiveOut.of(d) for d in state.query.directive_history(principal, run_id)]


@router.get("/alerts", response_model=list[AlertOut], responses=_ERRORS)
def list_alerts(
    run_id: RunId,
    status: Literal["open", "acknowledged", "resolved"] | None = None,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> list[AlertOut]:
    return [AlertOut.of(a) for a in state.alerts.list(principal, run_id, status)]


@router.post("/alerts/{alert_id}/ack", response_model=AlertOut, responses=_ERRORS)
def acknowledge_alert(
    run_id: RunId,
    alert_id: AlertId,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> AlertOut:
    """Acknowledge an open alert: no more re-notifications; it still resolves when the run recovers."""
    return AlertOut.of(state.alerts.acknowledge(principal, run_id, alert_id))


@router.put("/detector", responses=_ERRORS)
def set_detector_overrides(
    run_id: RunId,
    body: DetectorOverridesIn,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> dict[str, Any]:
    """Per-run detector settings (names and defaults: `monitor.detector.DetectorConfig`)."""
    return {"overrides": state.detection.set_overrides(principal, run_id, body.overrides)}


@router.get("/events", response_model=list[PhaseEventOut], responses=_ERRORS)
def list_phase_events(
    run_id: RunId, state: AppState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> list[PhaseEventOut]:
    """Phase changes of the run with their evidence."""
    return [PhaseEventOut.of(e) for e in state.query.phase_events(principal, run_id)]
