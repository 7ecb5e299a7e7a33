"""What the `lldmon` commands and the dashboard need of the service, as Protocols.

`ServicePort` is what a command works on: the local `monitor.bootstrap.Services` (the database) and
`monitor.cli.remote.RemoteState` (a service's HTTP API) both satisfy it, so a command is one code path
for both modes, and mypy checks that neither drifts from it (the assertions under `TYPE_CHECKING` in
`monitor.bootstrap` and `monitor.cli.remote`). `DashboardPort` adds what only the dashboard reads
(action records, a run's context in one read, alert counts, token checks); the dashboard runs inside
the service and gets `Services`.

The rules on what a person may ask for (bounds, allowed characters) are not here: the services apply
them (`contracts.directive.directive_problem` and friends), so every entry point refuses the same
things. Parameters before `/` are positional (their names differ between implementations).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from contracts.action_pages import ActionCursor
from monitor.domain import (
    ActionSummaries,
    AlertInfo,
    DirectiveInfo,
    Liveness,
    MetricSummary,
    PhaseEventInfo,
    Principal,
    RunContext,
    RunFilter,
    RunInfo,
    RunSummary,
    Series,
)

__all__ = [
    "AlertsPort",
    "DashboardAlertsPort",
    "DashboardPort",
    "DashboardQueryPort",
    "DirectivesPort",
    "Disposable",
    "LivenessPort",
    "QueryPort",
    "RunsPort",
    "ServicePort",
    "TokenCheck",
]


class RunsPort(Protocol):
    def list(self, principal: Principal, flt: RunFilter, /) -> list[RunInfo]: ...

    def get(self, principal: Principal, run_id: int, /) -> RunInfo: ...

    def set_policy(self, principal: Principal, run_id: int, policy: str, /) -> RunInfo: ...


class QueryPort(Protocol):
    def metric_names(self, principal: Principal, run_id: int, /) -> list[MetricSummary]: ...

    def history(
        self,
        principal: Principal,
        run_id: int,
        names: Sequence[str] | None,
        step_min: int | None = None,
        step_max: int | None = None,
        max_points: int | None = None,
        /,
    ) -> list[Series]: ...

    def history_csv(self, series: list[Series], nonfinite: Literal["wire", "python"] = "wire", /) -> str: ...

    def summary(self, principal: Principal, run_id: int, /) -> RunSummary: ...

    def phase_events(self, principal: Principal, run_id: int, /) -> list[PhaseEventInfo]: ...


class DirectivesPort(Protocol):
    def current(self, principal: Principal, run_id: int, /) -> DirectiveInfo: ...

    def set_manual(
        self,
        principal: Principal,
        run_id: int,
        /,
        *,
        llds_enabled: bool | None = None,
        lam: float | None = None,
        checkpoint: bool = False,
        stop: bool | None = None,
        stop_on_collapse: bool | None = None,
        reason: str = "",
        rollback_to: int | None = None,
        lr_scale: float | None = None,
    ) -> DirectiveInfo: ...


class AlertsPort(Protocol):
    def list(self, principal: Principal, run_id: int, status: str | None = None, /) -> list[AlertInfo]: ...

    def acknowledge(self, principal: Principal, run_id: int, alert_id: int, /) -> AlertInfo: ...


class LivenessPort(Protocol):
    def get(self, principal: Principal, run_id: int, /) -> Liveness: ...

    def set_thresholds(
        self, principal: Principal, run_id: int, stall_after_s: float | None, crash_after_s: float | None, /
    ) -> Liveness: ...


class Disposable(Protocol):
    def dispose(self) -> None: ...


class _Steering(Protocol):
    """What every client of the service reads runs through and steers them with."""

    @property
    def runs(self) -> RunsPort: ...

    @property
    def directives(self) -> DirectivesPort: ...


class ServicePort(_Steering, Protocol):
    """What every remote-capable command uses; `db.dispose()` releases the database or the HTTP client."""

    @property
    def query(self) -> QueryPort: ...

    @property
    def alerts(self) -> AlertsPort: ...

    @property
    def liveness(self) -> LivenessPort: ...

    @property
    def db(self) -> Disposable: ...


class DashboardQueryPort(QueryPort, Protocol):
    def context(self, principal: Principal, run_id: int, /) -> RunContext: ...

    def actions(
        self,
        principal: Principal,
        run_id: int,
        step_min: int | None,
        step_max: int | None,
        source: str | None,
        limit: int,
        after: ActionCursor | None = None,
        /,
    ) -> dict[str, list[Any]]: ...

    def action_summaries(
        self,
        principal: Principal,
        run_id: int,
        step_min: int | None,
        step_max: int | None,
        source: str | None,
        /,
    ) -> ActionSummaries: ...


class DashboardAlertsPort(AlertsPort, Protocol):
    def unresolved_counts(self, runs: Sequence[RunInfo], /) -> dict[int, int]: ...


class TokenCheck(Protocol):
    def authenticate(self, authorization: str | None, /) -> Principal: ...


class DashboardPort(_Steering, Protocol):
    """What the dashboard reads and writes (always through the caller's Principal)."""

    @property
    def query(self) -> DashboardQueryPort: ...

    @property
    def alerts(self) -> DashboardAlertsPort: ...

    @property
    def auth(self) -> TokenCheck: ...
