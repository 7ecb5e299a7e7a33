"""history count: metrics batches that wrote into a run's judged history

`runs.history_rev` counts the metrics batches whose first step was at or below the run's last step
(a resumed run re-logging steps, a step's metrics arriving in two batches, a late spooled batch). A
detector window a worker keeps between passes is used only while the count is the one it was read at,
so a batch ingested by any process makes every other process read the window again. Existing runs
start at 0 (no worker holds a window across an upgrade). Downgrading drops the column.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("history_rev", sa.BigInteger(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("history_rev")
