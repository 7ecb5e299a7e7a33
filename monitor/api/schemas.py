"""Request and response bodies of the JSON API (except the columnar ingest bodies: see `wire`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.directive import DEFAULT_LLDS_LAMBDA
from monitor.api.unicode import invalid_text_path
from monitor.detector.explain import explain_finding, explain_phase_change
from monitor.domain import AlertInfo, DirectiveInfo, IngestAck, PhaseEventInfo, RunInfo

Name = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00]+$")]
ProjectName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]
Tag = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        """Refuse lone surrogates anywhere in the body (see `monitor.api.unicode`)."""
        where = invalid_text_path(data)
        if where is not None:
            raise ValueError(f"{where}: not valid Unicode text (lone surrogate escape such as \\ud800)")
        return data


class RunCreate(_Strict):
    name: Name
    project: ProjectName | None = Field(
        default=None, description="Defaults to the token's project, else 'default'."
    )
    config: dict[str, Any] = Field(default_factory=dict)
    tags: list[Tag] = Field(default_factory=list, max_length=64)


class RunFinish(_Strict):
    status: Literal["finished", "failed", "crashed"] = "finished"


class PolicyIn(_Strict):
    policy: Literal["off", "alert", "auto"]


class RunOut(BaseModel):
    id: int
    name: str
    project: str
    config: dict[str, Any]
    tags: list[str]
    status: str
    directive_policy: str
    phase: str | None
    last_step: int | None
    created_at: datetime
    last_seen_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, run: RunInfo) -> RunOut:
        return cls(
            id=run.id,
            name=run.name,
            project=run.project,
            config=run.config,
            tags=run.tags,
            status=run.status,
            directive_policy=run.directive_policy,
            phase=run.phase,
            last_step=run.last_step,
            created_at=run.created_at,
            last_seen_at=run.last_seen_at,
            finished_at=run.finished_at,
        )


class LLDSState(BaseModel):
    enabled: bool
    lam: float = Field(description="LLDS weight lambda (lld-reference.md section 4).")


class DirectiveOut(BaseModel):
    version: int
    llds: LLDSState
    reason: str
    source: str
    step: int | None
    updated_at: datetime | None

    @classmethod
    def of(cls, d: DirectiveInfo) -> DirectiveOut:
        return cls(
            version=d.version,
            llds=LLDSState(enabled=d.llds_enabled, lam=d.llds_lambda),
            reason=d.reason,
            source=d.source,
            step=d.step,
            updated_at=d.created_at,
        )


class LLDSIn(_Strict):
    enabled: bool
    lam: float = Field(default=DEFAULT_LLDS_LAMBDA, ge=0, le=1e6)


class DirectiveIn(_Strict):
    llds: LLDSIn
    reason: str = Field(default="", max_length=2000, pattern=r"^[^\x00]*$")


class IngestAckOut(BaseModel):
    batch_id: str
    rows: int = Field(description="Rows stored by this batch (for a duplicate: by its first delivery).")
    duplicate: bool
    last_step: int | None
    directive: DirectiveOut

    @classmethod
    def of(cls, ack: IngestAck) -> IngestAckOut:
        return cls(
            batch_id=ack.batch_id,
            rows=ack.rows,
            duplicate=ack.duplicate,
            last_step=ack.last_step,
            directive=DirectiveOut.of(ack.directive),
        )


class MetricNameOut(BaseModel):
    name: str
    points: int
    first_step: int
    last_step: int


class SeriesOut(BaseModel):
    steps: list[int]
    values: list[float | str] = Field(description="Non-finite values as 'NaN', 'Infinity', '-Infinity'.")


class HistoryOut(BaseModel):
    run_id: int
    series: dict[str, SeriesOut]


class PhaseEventOut(BaseModel):
    id: int
    step: int
    phase: str
    previous_phase: str | None
    evidence: dict[str, Any] = Field(description="The detector's raw evidence (for machines).")
    explanation: list[str] = Field(
        default_factory=list,
        description="The phase change in words: a headline, then each signal with its statistic by name, "
        "the metric's recent value and baseline; the degraded-mode note only when detection is degraded.",
    )
    created_at: datetime

    @classmethod
    def of(cls, e: PhaseEventInfo) -> PhaseEventOut:
        return cls(
            id=e.id,
            step=e.step,
            phase=e.phase,
            previous_phase=e.previous_phase,
            evidence=e.evidence,
            explanation=explain_phase_change(e.phase, e.previous_phase, e.evidence, e.step),
            created_at=e.created_at,
        )


class AlertOut(BaseModel):
    id: int
    kind: str
    severity: str
    status: str
    message: str
    evidence: dict[str, Any] = Field(description="The detector's raw evidence (for machines).")
    explanation: list[str] = Field(
        default_factory=list,
        description="The evidence in words: each signal with its statistic by name, the metric's recent "
        "value and baseline; the degraded-mode note only when detection is degraded.",
    )
    first_step: int
    last_step: int
    created_at: datetime
    updated_at: datetime
    acknowledged_at: datetime | None
    resolved_at: datetime | None

    @classmethod
    def of(cls, a: AlertInfo) -> AlertOut:
        return cls(
            id=a.id,
            kind=a.kind,
            severity=a.severity,
            status=a.status,
            message=a.message,
            evidence=a.evidence,
            explanation=explain_finding(a.kind, "", a.evidence, a.first_step),
            first_step=a.first_step,
            last_step=a.last_step,
            created_at=a.created_at,
            updated_at=a.updated_at,
            acknowledged_at=a.acknowledged_at,
            resolved_at=a.resolved_at,
        )


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorOut(BaseModel):
    error: ErrorBody


class DetectorOverridesIn(_Strict):
    overrides: dict[str, Any] = Field(description="DetectorConfig field -> value; {} restores the defaults.")
