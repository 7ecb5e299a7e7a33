"""alert hysteresis: where an alert resolved, how often it re-opened, the last event sent about it

`resolved_step` is the step an alert was judged cleared at (the hold before its condition counts as a
new alert is measured from it), `reopen_count` how many times it continued because its condition came
back within that hold, `last_event` the last notification event planned for it (a resolution is not
announced twice). Alerts resolved before this revision had their `last_step` moved to the step they
were judged cleared at, so that is their `resolved_step`; `last_event` stays NULL (their next
resolution, if they continue, is announced). Downgrading drops the columns.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("resolved_step", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("reopen_count", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("last_event", sa.String(length=16), nullable=True))
    op.execute(sa.text("UPDATE alerts SET resolved_step = last_step WHERE status = 'resolved'"))


def downgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_column("last_event")
        batch_op.drop_column("reopen_count")
        batch_op.drop_column("resolved_step")
