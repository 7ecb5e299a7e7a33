"""detector state and overrides on runs, notification count on alerts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("detector_state", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("detector_overrides", sa.JSON(), nullable=True))
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("notify_count", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_column("notify_count")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("detector_overrides")
        batch_op.drop_column("detector_state")
