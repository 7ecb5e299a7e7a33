"""What every callback needs: the services, the URL helper, timing settings."""

from __future__ import annotations

from dataclasses import dataclass

from dashboard.layout import PathFor
from monitor.errors import LLDMonError
from monitor.ports import DashboardPort


@dataclass(frozen=True)
class DashContext:
    state: DashboardPort
    path_for: PathFor
    run_refresh_ms: int
    runs_refresh_ms: int


def error_text(exc: LLDMonError) -> str:
    return f"{exc.status_code}: {exc.message}"
