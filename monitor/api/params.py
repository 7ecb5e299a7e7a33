"""Bounded path and query parameters: an id or step the database column cannot hold is a 422 that
names the parameter, never a driver overflow (a 500) deep in a query."""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import Path, Query

from monitor.domain import MAX_BIGINT, MAX_RUN_ID

RunId = Annotated[int, Path(ge=0, le=MAX_RUN_ID, description="The run's id.")]
AlertId = Annotated[int, Path(ge=0, le=MAX_BIGINT, description="The alert's id.")]

NO_NUL: Final = r"^[^\x00]*$"
"""Text parameters: PostgreSQL cannot compare with (or store) a NUL character: a 422, not a 500."""
NoNul = Annotated[str, Query(pattern=NO_NUL)]
