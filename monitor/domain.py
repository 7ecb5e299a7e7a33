"""Plain domain objects the store returns and the services pass around (no ORM instances leak out)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from contracts.directive import Directive

MAX_BIGINT: Final = 2**63 - 1
"""Largest value of a BIGINT column (steps, alert ids) and of SQLite's INTEGER: every id or step the
service takes is bounded by it, so an overflow is a clear refusal, never a driver error."""
MAX_RUN_ID: Final = 2**31 - 1
"""The largest run id (the runs table's INTEGER key): a larger id names no run."""


@dataclass(frozen=True)
class RunInfo:
    id: int
    project: str
    project_id: int
    name: str
    config: dict[str, Any]
    tags: list[str]
    status: str
    directive_policy: str
    phase: str | None
    last_step: int | None
    created_at: datetime
    last_seen_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class DirectiveInfo(Directive):
    """What the trainer should do now: the directive it is sent (`contracts.directive.Directive`, whose
    `to_wire` is its body) plus what only the service knows of a version. Version 0 is the implicit
    default (LLDS off). A subclass rather than a holder of one, so a version reads as the trainer's
    directive does (`d.llds.lam`, `d.version`) and is one to `contracts.directive.parse_directive`."""

    updated_at: datetime | None = None
    """When this version was made (None: the implicit default)."""
    llds_manual: bool = False
    """A person set LLDS in this or an earlier version: the detector leaves LLDS alone."""
    applied_step: int | None = None
    """In a history: the first step at which the trainer acknowledged this version (None: not yet)."""


@dataclass(frozen=True)
class MetricsColumns:
    """A decoded, validated metrics batch in long form (NaN already mapped to None for storage)."""

    steps: list[int]
    names: list[str]
    values: list[float | None]

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class ActionColumns:
    """A decoded, validated action batch, one list per column (`contracts.wire.ACTION_COLUMNS`, in
    that order), deduplicated by key."""

    step: list[int]
    traj_index: list[int]
    action_index: list[int]
    n_tokens: list[int]
    delta: list[float | None]
    old_logp_mean: list[float | None]
    advantage: list[float | None]
    reward: list[float | None]
    is_answer: list[bool]
    source: list[str]

    def __len__(self) -> int:
        return len(self.step)


@dataclass(frozen=True)
class ActionSummaries:
    """Per-(step, source) quantiles of the action deltas, precomputed when the block was written and
    kept when retention prunes its records: the dashboard's quantiles-over-steps panel reads only these.
    Lists are parallel, ordered by (step, source); `q_all[i][j]` is the `levels[j]` quantile of the
    finite deltas of all `n_all[i]` records, `q_pos` of those with advantage > 0 (NaN where n is 0)."""

    steps: list[int]
    sources: list[str]
    levels: tuple[float, ...]
    n_all: list[int]
    q_all: list[list[float]]
    n_pos: list[int]
    q_pos: list[list[float]]
    pruned: list[bool]
    """True where the block's records were dropped by retention (its summary remains)."""

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class IngestAck:
    batch_id: str
    rows: int
    duplicate: bool
    directive: DirectiveInfo
    last_step: int | None


@dataclass(frozen=True)
class Series:
    name: str
    steps: list[int]
    values: list[float]


@dataclass(frozen=True)
class MetricSummary:
    name: str
    points: int
    first_step: int
    last_step: int


@dataclass(frozen=True)
class TokenInfo:
    id: int
    project: str
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class Principal:
    """Who is calling. `project_id is None` means auth is off (no tokens exist): full access."""

    project_id: int | None = None
    project: str | None = None

    @property
    def unrestricted(self) -> bool:
        return self.project_id is None


@dataclass(frozen=True)
class PhaseEventInfo:
    id: int
    run_id: int
    step: int
    phase: str
    previous_phase: str | None
    evidence: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class RollbackInfo:
    """A rollback a trainer carried out (`monitor.db.models.Rollback`): steps `to_step + 1` to
    `from_step` were trained, undone and are being trained again."""

    id: int
    run_id: int
    from_step: int
    to_step: int
    version: int
    undone_phases: list[dict[str, Any]]
    created_at: datetime

    @property
    def steps_redone(self) -> int:
        return self.from_step - self.to_step


@dataclass(frozen=True)
class DeliveryInfo:
    """Where an alert's latest notification stands at one sink (`contracts.alerts.DELIVERY_STATUSES`)."""

    sink: str
    event: str
    status: str
    attempts: int
    last_error: str | None
    updated_at: datetime


@dataclass(frozen=True)
class ActiveCondition:
    """What is wrong with a run at a step (a detector finding, a liveness check): the input of
    `monitor.alerting.rules.plan_alerts`; here because the store writes it too."""

    kind: str
    severity: str
    step: int
    """The step the condition started at (an alert's `first_step`)."""
    message: str
    evidence: dict[str, Any]
    active_at: int | None = None
    """The last step the condition was seen to hold (the detector's `evidence["active_at"]`); None: `step`."""

    @property
    def last_held(self) -> int:
        """The last step the condition held, never before it started: an alert's `last_step`."""
        return self.step if self.active_at is None else max(self.step, self.active_at)


@dataclass(frozen=True)
class OpenAlert:
    """An unresolved alert as the alert rules need it."""

    id: int
    kind: str
    severity: str
    status: str  # "open" | "acknowledged"
    last_notified_at: datetime | None
    first_step: int | None = None
    last_step: int | None = None
    reopen_count: int = 0
    last_event: str | None = None
    """The last notification event planned for it (`contracts.alerts.NOTIFICATION_EVENTS`); `resolved`
    while it continues silently after re-opening, so its next resolution is not announced twice."""


@dataclass(frozen=True)
class ResolvedAlert:
    """A run's latest resolved alert of a kind, as the hysteresis rule needs it to continue it."""

    id: int
    kind: str
    severity: str
    first_step: int
    resolved_step: int | None
    """The step it was judged cleared at (None: unknown, it is never continued)."""
    acknowledged: bool
    """Acknowledged before it resolved: it continues acknowledged (no re-notifications)."""
    reopen_count: int = 0


@dataclass(frozen=True)
class DeliveryUpdate:
    """One delivery attempt's outcome for an (alert, sink), from the dispatcher to the store."""

    alert_id: int
    sink: str
    event: str
    status: str  # contracts.alerts.DELIVERY_STATUSES
    attempts: int
    error: str | None = None


@dataclass(frozen=True)
class AlertInfo:
    id: int
    run_id: int
    kind: str
    severity: str
    status: str
    message: str
    evidence: dict[str, Any]
    first_step: int
    last_step: int
    created_at: datetime
    updated_at: datetime
    acknowledged_at: datetime | None = None
    resolved_at: datetime | None = None
    deliveries: tuple[DeliveryInfo, ...] = ()
    """One per sink that was asked to send it (the log is not listed)."""
    reopen_count: int = 0
    """Times its condition came back within the hold after it resolved and it continued (a flicker)."""
    resolved_step: int | None = None
    """The step it was judged cleared at, while resolved."""


@dataclass(frozen=True)
class RunFilter:
    project: str | None = None
    status: str | None = None
    tag: str | None = None
    limit: int = 100
    offset: int = 0
    project_ids: list[int] | None = field(default=None)
    name: str | None = None
    """Exact run name (unique within a project, so at most one run per project matches)."""


@dataclass(frozen=True)
class MetricLast(MetricSummary):
    """A metric's extent plus its value at `last_step` (NaN for a logged NaN)."""

    last_value: float = float("nan")


@dataclass(frozen=True)
class RunContext:
    """A run with everything drawn on top of its series (phase events, alerts, directives), read in one
    transaction so the parts agree."""

    run: RunInfo
    phases: list[PhaseEventInfo]
    alerts: list[AlertInfo]
    directives: list[DirectiveInfo]
    directive: DirectiveInfo
    rollbacks: list[RollbackInfo] = field(default_factory=list)


@dataclass(frozen=True)
class RunSummary:
    """Everything `lldmon runs show` prints, read in one transaction so the parts agree."""

    run: RunInfo
    n_steps: int
    first_step: int | None
    last_step: int | None
    metrics: list[MetricLast]
    phases: list[PhaseEventInfo]
    alerts: list[AlertInfo]
    directives: list[DirectiveInfo]
    directive: DirectiveInfo
    rollbacks: list[RollbackInfo] = field(default_factory=list)


@dataclass(frozen=True)
class Liveness:
    """A run's liveness as the API shows it: thresholds set on the run (None: defaults) and in force."""

    run_id: int
    status: str
    last_seen_at: datetime
    last_step_at: datetime | None
    silent_s: float
    stall_after_s: float | None
    crash_after_s: float | None
    effective_stall_after_s: float
    effective_crash_after_s: float
    median_step_s: float | None
