"""What the read and control routers of one run share: their prefix, tag and documented errors."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from monitor.api.schemas import ErrorOut

ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (401, 403, 404, 422)}


def run_router() -> APIRouter:
    """A router under `/runs/{run_id}`, tagged `query` as the API documents all of these."""
    return APIRouter(prefix="/runs/{run_id}", tags=["query"])
