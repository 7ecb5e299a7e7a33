"""Request and response bodies of the JSON API (except the columnar ingest bodies: see `wire`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from contracts.directive import DEFAULT_LLDS_LAMBDA, MAX_LLDS_LAMBDA, MAX_REASON_CHARS
from contracts.wire import encode_float
from monitor.detector.explain import explain_finding, explain_phase_change
from monitor.domain import (
    AlertInfo,
    DirectiveInfo,
    IngestAck,
    PhaseEventInfo,
    RollbackInfo,
    RunInfo,
    RunSummary,
)
from monitor.surrogates import invalid_text_path

Name = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00]+$")]
ProjectName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]
Tag = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]+$")]


MAX_BODY_DEPTH: Final = 64
"""Nesting levels a JSON body may have: deeper ones would overflow the stack of whatever walks them
(the text check below, pydantic's serialiser, the error handler echoing the input)."""


def _refuse(field: str | None, message: str) -> ValidationError:
    """A validation error at `field` (the body if None) that does not echo the input back."""
    error = InitErrorDetails(
        type=PydanticCustomError("invalid_body", message), loc=(field,) if field else (), input=None
    )
    return ValidationError.from_exception_data("body", [error])


def _deep_field(data: Any, max_depth: int) -> str | None:
    """The top-level field holding something nested deeper than `max_depth` levels ("" for the body
    itself), None if nothing is. Recursion is bounded by `max_depth`, not by the input."""

    def deeper(value: Any, depth: int) -> bool:
        if isinstance(value, dict):
            items: Any = value.values()
        elif isinstance(value, list | tuple):
            items = value
        else:
            return False
        return depth > max_depth or any(deeper(item, depth + 1) for item in items)

    if isinstance(data, dict):
        return next((str(key) for key, value in data.items() if deeper(value, 2)), None)
    return "" if deeper(data, 1) else None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        """Refuse lone surrogates anywhere in the body (see `monitor.surrogates`), after refusing
        bodies nested too deeply to walk."""
        field = _deep_field(data, MAX_BODY_DEPTH)
        if field is not None:
            raise _refuse(field, f"nested deeper than {MAX_BODY_DEPTH} levels")
        where = invalid_text_path(data)
        if where is not None:
            raise ValueError(f"{where}: not valid Unicode text (lone surrogate escape such as \\ud800)")
        return data


class RunCreate(_Strict):
    name: Name
    project: ProjectName | None = Field(
        default=None, description="Defaults to the token's project, else 'default'."
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Free-form JSON, at most 32 levels deep and 256 KiB encoded; non-finite numbers are "
        "stored and returned as the strings 'NaN', 'Infinity', '-Infinity'.",
    )
    tags: list[Tag] = Field(default_factory=list, max_length=64)

    @model_validator(mode="before")
    @classmethod
    def _bounded_config(cls, data: Any) -> Any:
        """Depth and size of `config`, checked before anything walks it (this runs before the text
        check): a config too deep to serialise was once stored and then broke every run listing."""
        if isinstance(data, dict) and "config" in data:
            # Imported here: the CLI's remote mode reads these schemas without the store (SQLAlchemy).
            from monitor.services.runs import config_problem

            problem = config_problem(data["config"])
            if problem is not None:
                raise _refuse("config", problem)
        return data


class RunFinish(_Strict):
    status: Literal["finished", "failed", "crashed"] = "finished"


class PolicyIn(_Strict):
    policy: Literal["off", "alert", "auto", "heal"]


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
    lam: float = Field(description="LLDS weight lambda (docs/science.md section 4).")


class DirectiveOut(BaseModel):
    version: int
    llds: LLDSState
    reason: str
    source: str
    step: int | None
    updated_at: datetime | None
    checkpoint: int = Field(
        description="Id of the latest checkpoint request (the version that made it); 0: none."
    )
    stop: int = Field(description="Id of the standing stop request (the version that made it); 0: none.")
    stop_reason: str
    stop_on_collapse: bool = Field(description="Whether entering collapse requests a stop (opt-in per run).")
    rollback: int = Field(
        0, description="Id of the latest rollback request (the version that made it); 0: none."
    )
    rollback_to: int | None = Field(
        None, description="The rollback request's step: restore the newest checkpoint saved at or before it."
    )
    lr_scale: float = Field(
        1.0,
        description="Factor on the learning rate the job started with, applied when it restores a checkpoint.",
    )
    applied_version: int = Field(description="The highest version the trainer acknowledged.")
    applied_step: int | None = Field(
        None, description="In GET /directives: the first step at which the trainer acknowledged this version."
    )

    @classmethod
    def of(cls, d: DirectiveInfo) -> DirectiveOut:
        """The directive's wire body (`contracts.directive.Directive.to_wire`, what a trainer reads)
        plus when the version was made and acknowledged."""
        return cls.model_validate({**d.to_wire(), "updated_at": d.updated_at, "applied_step": d.applied_step})


class LLDSIn(_Strict):
    enabled: bool
    lam: float = Field(default=DEFAULT_LLDS_LAMBDA, ge=0, le=MAX_LLDS_LAMBDA)


class RollbackIn(_Strict):
    to_step: int = Field(
        ge=0, le=2**63 - 1, description="Restore the newest checkpoint saved at or before this step."
    )
    lr_scale: float | None = Field(
        None, gt=0, le=1, description="Factor on the learning rate the job started with (omitted: unchanged)."
    )


class DirectiveIn(_Strict):
    """A manual change: any of the levers; what is left out keeps its value."""

    llds: LLDSIn | None = None
    rollback: RollbackIn | None = Field(
        None, description="Request a rollback (the trainer restores a checkpoint and continues from it)."
    )
    checkpoint: bool = Field(
        False, description="true: request a checkpoint now (each request is saved once)."
    )
    stop: bool | None = Field(None, description="true: request a graceful stop; false: withdraw one.")
    stop_on_collapse: bool | None = Field(None, description="Request a stop when the run enters collapse.")
    reason: str = Field(default="", max_length=MAX_REASON_CHARS, pattern=r"^[^\x00]*$")

    @model_validator(mode="after")
    def _something(self) -> DirectiveIn:
        if (
            self.llds is None
            and self.rollback is None
            and not self.checkpoint
            and self.stop is None
            and self.stop_on_collapse is None
        ):
            raise PydanticCustomError(
                "nothing_to_change",
                "nothing to change: give llds, checkpoint, rollback, stop or stop_on_collapse",
            )
        return self


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


class CombinedAckOut(BaseModel):
    """The acknowledgements of a combined request's two batches (both carry the run's directive)."""

    metrics: IngestAckOut
    actions: IngestAckOut


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


class DeliveryOut(BaseModel):
    sink: str = Field(description="`webhook:<host>/<digest of the URL>` or `slack:...` (no secrets).")
    event: str = Field(description="The latest notification sent there: firing, escalated or resolved.")
    status: str = Field(description="pending, retrying, delivered or failed.")
    attempts: int
    last_error: str | None = Field(description="HTTP status or transport error of the last failed attempt.")
    updated_at: datetime


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
    first_step: int = Field(description="The step its condition started at.")
    last_step: int = Field(
        description="The last step its condition was seen to hold: moves on while the alert is open."
    )
    resolved_step: int | None = Field(
        default=None, description="The step it was judged cleared at (null unless resolved)."
    )
    reopen_count: int = Field(
        default=0,
        description="Times its condition came back within the hold after it resolved and the alert "
        "continued instead of a new one opening (a flickering condition).",
    )
    created_at: datetime
    updated_at: datetime
    acknowledged_at: datetime | None
    resolved_at: datetime | None
    deliveries: list[DeliveryOut] = Field(
        default_factory=list, description="Where its latest notification stands, per sink."
    )

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
            resolved_step=a.resolved_step,
            reopen_count=a.reopen_count,
            created_at=a.created_at,
            updated_at=a.updated_at,
            acknowledged_at=a.acknowledged_at,
            resolved_at=a.resolved_at,
            deliveries=[
                DeliveryOut(
                    sink=d.sink,
                    event=d.event,
                    status=d.status,
                    attempts=d.attempts,
                    last_error=d.last_error,
                    updated_at=d.updated_at,
                )
                for d in a.deliveries
            ],
        )


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None


class StepExtentOut(BaseModel):
    count: int = Field(description="Distinct steps with at least one metric.")
    first: int | None
    last: int | None


class MetricLastOut(BaseModel):
    name: str
    points: int
    first_step: int
    last_step: int
    last_value: float | str = Field(
        description="The value at `last_step`; non-finite as 'NaN', 'Infinity', ..."
    )


class RollbackOut(BaseModel):
    """A rollback the trainer carried out: steps `to_step + 1` to `from_step` were trained, undone (their
    metrics replaced by the new attempt's) and trained again."""

    id: int
    from_step: int
    to_step: int
    steps_redone: int
    version: int = Field(description="The directive version whose request it carried out (0: not known).")
    undone_phases: list[dict[str, Any]] = Field(
        description="The phase changes of the undone steps (no longer in the run's phase history)."
    )
    created_at: datetime

    @classmethod
    def of(cls, r: RollbackInfo) -> RollbackOut:
        return cls(
            id=r.id,
            from_step=r.from_step,
            to_step=r.to_step,
            steps_redone=r.steps_redone,
            version=r.version,
            undone_phases=r.undone_phases,
            created_at=r.created_at,
        )


class RunSummaryOut(BaseModel):
    """A run at a glance (what `lldmon runs show` prints), read in one transaction so the parts agree."""

    run: RunOut
    steps: StepExtentOut
    metrics: list[MetricLastOut]
    phases: list[PhaseEventOut]
    alerts: list[AlertOut]
    directives: list[DirectiveOut]
    directive: DirectiveOut
    rollbacks: list[RollbackOut] = Field(default_factory=list)

    @classmethod
    def of(cls, s: RunSummary) -> RunSummaryOut:
        return cls(
            run=RunOut.of(s.run),
            steps=StepExtentOut(count=s.n_steps, first=s.first_step, last=s.last_step),
            metrics=[
                MetricLastOut(
                    name=m.name,
                    points=m.points,
                    first_step=m.first_step,
                    last_step=m.last_step,
                    last_value=encode_float(m.last_value),
                )
                for m in s.metrics
            ],
            phases=[PhaseEventOut.of(e) for e in s.phases],
            alerts=[AlertOut.of(a) for a in s.alerts],
            directives=[DirectiveOut.of(d) for d in s.directives],
            directive=DirectiveOut.of(s.directive),
            rollbacks=[RollbackOut.of(r) for r in s.rollbacks],
        )


class ErrorOut(BaseModel):
    error: ErrorBody


class DetectorOverridesIn(_Strict):
    overrides: dict[str, Any] = Field(description="DetectorConfig field -> value; {} restores the defaults.")


class ActionSummariesOut(BaseModel):
    """Per-step quantiles of the action deltas, one entry per (step, source) block, ordered by step then
    source; kept when retention prunes a step's raw records (`pruned`), so the history stays complete."""

    run_id: int
    steps: list[int]
    sources: list[str]
    levels: list[float] = Field(description="The quantile levels of every `q_all` and `q_pos` row.")
    n_all: list[int] = Field(description="Records with a finite delta at the step.")
    q_all: list[list[float | str]] = Field(
        description="Delta quantiles at `levels` of all records; 'NaN' where the step has none."
    )
    n_pos: list[int] = Field(description="Records with a finite delta and a positive advantage.")
    q_pos: list[list[float | str]] = Field(description="The same over records with advantage > 0.")
    pruned: list[bool] = Field(description="The step's raw records were dropped by retention.")
