"""What every callback needs: the services, the URL helper, timing settings."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from dashboard.layout import PathFor
from monitor.bootstrap import Services
from monitor.errors import LLDMonError


@dataclass(frozen=True)
class DashContext:
    state: Services
    path_for: PathFor
    run_refresh_ms: int
    runs_refresh_ms: int


def error_text(exc: LLDMonError) -> str:
    return f"{exc.status_code}: {exc.message}"


def validation_text(exc: ValidationError) -> str:
    """A request body's first validation error as the API words it (422, the field, the reason)."""
    errors = exc.errors()
    if not errors:
        return "422: invalid input"
    field = ".".join(str(part) for part in errors[0]["loc"])
    return f"422: {field}: {errors[0]['msg']}" if field else f"422: {errors[0]['msg']}"
