"""run status finality: whether a run's status was set by an explicit finish

`runs.status_final` is true when the status came from an explicit finish (`POST /runs/{id}/finish`, a
trainer's `close`, a complete import): the run has ended and a late batch or heartbeat leaves it so. A
status set otherwise (`stalled` or `crashed` by the liveness sweeper, `failed` by an import stopped part
way) is a judgement from outside the job: its next batch or heartbeat shows it alive and turns it back
into `running`. Existing `finished` and `failed` runs become final, as they behaved before; `crashed`
runs stay revivable, as before (the sweeper's and an explicit one could not be told apart).
Downgrading drops the column.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("status_final", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    runs = sa.table("runs", sa.column("status", sa.String()), sa.column("status_final", sa.Boolean()))
    op.execute(runs.update().where(runs.c.status.in_(("finished", "failed"))).values(status_final=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("status_final")
