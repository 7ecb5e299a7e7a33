"""The schema. Migrations in `migrations/` are its source of truth; a test checks they agree.

Metric values: SQLite cannot store NaN (it binds NaN as NULL), so on every dialect a NULL `value`
means NaN, +-inf are stored natively, and a step at which a metric was not logged has no row at all.
That keeps NaN, inf and "missing" distinguishable everywhere.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from monitor.db.base import Base

# SQLite only auto-increments INTEGER PRIMARY KEY columns, so big ids are plain INTEGER there.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def _now() -> Any:
    return func.now()


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every dialect (SQLite returns naive values otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())


class ApiToken(Base):
    """A bearer token scoped to one project. Only its SHA-256 is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("project_id", "name", name="uq_runs_project_id_name"),
        CheckConstraint("status IN ('running', 'finished', 'failed', 'crashed', 'stalled')", name="status"),
        CheckConstraint("directive_policy IN ('off', 'alert', 'auto', 'heal')", name="directive_policy"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(256))
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="running", index=True)
    directive_policy: Mapped[str] = mapped_column(String(8), default="alert")
    phase: Mapped[str | None] = mapped_column(String(32))
    detector_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    detector_overrides: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Liveness (0004): thresholds set per run (NULL: the service's defaults), when the last step
    # arrived, and recent seconds per step (their median scales the default stall threshold).
    stall_after_s: Mapped[float | None] = mapped_column(Double)
    crash_after_s: Mapped[float | None] = mapped_column(Double)
    last_step_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    step_intervals: Mapped[list[float] | None] = mapped_column(JSON)
    status_final: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The status was set by an explicit finish (revision 0010): a late batch or heartbeat does not revive it."""
    history_rev: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Metrics batches that wrote at or below the run's last step (revision 0012): history a detector
    window read before such a batch may lack, so a window cached with another count is read again."""


class RunTag(Base):
    __tablename__ = "run_tags"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(128), primary_key=True, index=True)


class StepMetric(Base):
    """Long format: one row per (run, metric name, step). NULL value = NaN (see module docstring)."""

    __tablename__ = "step_metrics"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[float | None] = mapped_column(Double)


class ActionBlock(Base):
    """The action records of one (run, step, source) as one encoded block (`monitor.store.action_codec`):
    storage scales with steps, not actions. Keyed by run first, so the table can be hash-partitioned or
    distributed by run_id. Retention sets `payload` NULL and keeps `n_records` and the quantile
    `summary`; `updated_at` (set on every write) is what retention ages."""

    __tablename__ = "action_blocks"
    __table_args__ = (CheckConstraint("source IN ('loss', 'probe')", name="source"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    source: Mapped[str] = mapped_column(String(8), primary_key=True)
    n_records: Mapped[int] = mapped_column(Integer)
    payload: Mapped[bytes | None] = mapped_column(LargeBinary)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())


class PhaseEvent(Base):
    """A change of the run's LLD phase, with the evidence that justified it."""

    __tablename__ = "phase_events"
    __table_args__ = (Index("ix_phase_events_run_id_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    phase: Mapped[str] = mapped_column(String(32))
    previous_phase: Mapped[str | None] = mapped_column(String(32))
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())


class Alert(Base):
    __tablename__ = "alerts"
    __table_args__ = (
        Index("ix_alerts_run_id_kind", "run_id", "kind"),
        CheckConstraint("severity IN ('info', 'warning', 'critical')", name="severity"),
        CheckConstraint("status IN ('open', 'acknowledged', 'resolved')", name="status"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="open")
    message: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())
    last_notified_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    notify_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    resolved_step: Mapped[int | None] = mapped_column(BigInteger)
    """The step it was judged cleared at (the hysteresis hold counts from it); NULL while unresolved."""
    reopen_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Times it continued because its condition came back within the hold after it resolved."""
    last_event: Mapped[str | None] = mapped_column(String(16))
    """The last notification event planned for it (firing, escalated, resolved)."""


class AlertDelivery(Base):
    """Where an alert's latest notification stands at one sink (`contracts.alerts`)."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'retrying', 'delivered', 'failed')", name="status"),
    )

    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), primary_key=True)
    sink: Mapped[str] = mapped_column(String(128), primary_key=True)
    event: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())


class Directive(Base):
    """What the service tells the trainer to do. Append-only: the highest version is current."""

    __tablename__ = "directives"
    __table_args__ = (UniqueConstraint("run_id", "version", name="uq_directives_run_id_version"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    llds_enabled: Mapped[bool] = mapped_column(Boolean)
    llds_lam: Mapped[float] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(16))
    step: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())
    """When this version was made, i.e. when the run's directive last changed (its name on the API);
    recording the version's acknowledgement (`applied_step`) leaves it as it is."""
    # the levers (revision 0006): request ids are the version that asked (0: none), carried forward
    checkpoint: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    stop: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    stop_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    stop_on_collapse: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    llds_manual: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Whether a person set LLDS in this or an earlier version (then the detector never changes it)."""
    applied_step: Mapped[int | None] = mapped_column(BigInteger)
    """The step of the first acknowledgement that covered this version (revision 0009); None: none yet."""
    # the rollback lever (revision 0013): a request id as above, its step and the learning-rate factor
    rollback: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    rollback_to: Mapped[int | None] = mapped_column(BigInteger)
    lr_scale: Mapped[float] = mapped_column(Double, default=1.0, server_default="1.0")


class Rollback(Base):
    """A rollback a trainer carried out: it had trained up to `from_step`, restored its checkpoint of
    `to_step` and trains steps `to_step + 1`.. again (their metrics replace the first attempt's). The
    phase events of the undone steps move here (`undone_phases`), out of the run's phase history."""

    __tablename__ = "rollbacks"
    __table_args__ = (Index("ix_rollbacks_run_id_from_step", "run_id", "from_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    from_step: Mapped[int] = mapped_column(BigInteger)
    to_step: Mapped[int] = mapped_column(BigInteger)
    version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """The directive version whose request the trainer carried out (0: not known)."""
    undone_phases: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())


class IngestBatch(Base):
    """Ledger of committed batches, per run and kind: a re-sent batch id is acknowledged without writing
    again if its payload digest matches, refused (409) if not. Rows from before revision 0003 have no
    digest and accept any re-send as a duplicate."""

    __tablename__ = "ingest_batches"
    __table_args__ = (CheckConstraint("kind IN ('metrics', 'actions')", name="kind"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    batch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    digest: Mapped[str | None] = mapped_column(String(64))
    n_rows: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), server_default=_now())
