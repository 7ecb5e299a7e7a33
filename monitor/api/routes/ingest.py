"""Columnar ingest of step metrics and action records. Acknowledged only after commit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from monitor.api.body import read_limited_body
from monitor.api.params import RunId
from monitor.api.schemas import CombinedAckOut, ErrorOut, IngestAckOut
from monitor.api.state import AppState, get_principal, get_state
from monitor.api.threads import run_ingest
from monitor.api.wire import decode_actions, decode_combined, decode_metrics
from monitor.domain import IngestAck, Principal
from monitor.errors import Conflict, InvalidInput, PayloadTooLarge

router = APIRouter(prefix="/runs/{run_id}", tags=["ingest"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 403, 404, 409, 413, 422, 503)
}


def _body_doc(schema_name: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}},
        }
    }


@router.post(
    "/metrics",
    response_model=IngestAckOut,
    responses=_ERRORS,
    openapi_extra=_body_doc("MetricsBatchWire"),
)
async def ingest_metrics(
    run_id: RunId,
    request: Request,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """Store a batch of step metrics; a re-sent `batch_id` is acknowledged without writing again (409 if
    its payload differs from the first delivery's)."""

    def work(body: bytes) -> IngestAck:
        batch_id, batch = decode_metrics(body)
        return state.ingest.ingest_metrics(principal, run_id, batch_id, batch)

    return await _ingest(request, state, "metrics", work)


@router.post(
    "/actions",
    response_model=IngestAckOut,
    responses=_ERRORS,
    openapi_extra=_body_doc("ActionsBatchWire"),
)
async def ingest_actions(
    run_id: RunId,
    request: Request,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """Store a batch of per-action records (likelihood deltas per model action)."""

    def work(body: bytes) -> IngestAck:
        batch_id, batch = decode_actions(body)
        return state.ingest.ingest_actions(principal, run_id, batch_id, batch)

    return await _ingest(request, state, "actions", work)


@router.post(
    "/combined",
    response_model=CombinedAckOut,
    responses=_ERRORS,
    openapi_extra=_body_doc("CombinedBatchWire"),
)
async def ingest_combined(
    run_id: RunId,
    request: Request,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """Store a metrics batch and an actions batch (a training step's) in one transaction, each
    acknowledged under its own `batch_id` as its own endpoint would: a re-send of either, here or
    there, is a duplicate. Saves a trainer the second request per step."""

    def work(body: bytes) -> CombinedAckOut:
        metrics, actions = decode_combined(body)
        metrics_ack, actions_ack = state.ingest.ingest_combined(principal, run_id, metrics, actions)
        return CombinedAckOut(metrics=IngestAckOut.of(metrics_ack), actions=IngestAckOut.of(actions_ack))

    return await _ingest(request, state, "combined", work)


async def _ingest(
    request: Request,
    state: AppState,
    kind: str,
    work: Callable[[bytes], IngestAck | CombinedAckOut],
) -> Response:
    try:
        body = await read_limited_body(request, state.settings.max_body_bytes)
        ack = await run_ingest(state.settings.ingest_threads, work, body)
    except (InvalidInput, PayloadTooLarge, Conflict):
        state.telemetry.record_rejected(kind)
        raise
    out = ack if isinstance(ack, CombinedAckOut) else IngestAckOut.of(ack)
    # Serialised here: returned as a model, FastAPI would validate it against `response_model` again.
    return Response(out.model_dump_json(), media_type="application/json")
