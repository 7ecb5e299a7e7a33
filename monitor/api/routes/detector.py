"""A run's detector settings (overrides of `monitor.detector.DetectorConfig`)."""

from __future__ import annotations

from typing import Any

from fastapi import Depends

from monitor.api.params import RunId
from monitor.api.routes._run import ERRORS, run_router
from monitor.api.schemas import DetectorOverridesIn
from monitor.api.state import AppState, get_principal, get_state
from monitor.domain import Principal

router = run_router()


@router.put("/detector", responses=ERRORS)
def set_detector_overrides(
    run_id: RunId,
    body: DetectorOverridesIn,
    state: AppState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> dict[str, Any]:
    """Per-run detector settings (names and defaults: `monitor.detector.DetectorConfig`)."""
    return {"overrides": state.detection.set_overrides(principal, run_id, body.overrides)}
