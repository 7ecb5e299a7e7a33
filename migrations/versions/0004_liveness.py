"""liveness: `stalled` run status, per-run stall/crash thresholds, last step time, step intervals

A run silent past its stall threshold becomes `stalled`, past its crash threshold `crashed`; the
thresholds are per run (NULL: the service's defaults, which scale with the run's median seconds per
step, kept in `step_intervals`). `last_step_at` feeds `lldmon_run_last_step_timestamp_seconds`.
Downgrading turns `stalled` runs back into `running` ones (the old schema has no such status) and drops
the new columns.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_OLD = "status IN ('running', 'finished', 'failed', 'crashed')"
_NEW = "status IN ('running', 'finished', 'failed', 'crashed', 'stalled')"


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stall_after_s", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("crash_after_s", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("last_step_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("step_intervals", sa.JSON(), nullable=True))
        batch_op.drop_constraint(batch_op.f("ck_runs_status"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_runs_status"), _NEW)


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'running' WHERE status = 'stalled'")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_runs_status"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_runs_status"), _OLD)
        batch_op.drop_column("step_intervals")
        batch_op.drop_column("last_step_at")
        batch_op.drop_column("crash_after_s")
        batch_op.drop_column("stall_after_s")
