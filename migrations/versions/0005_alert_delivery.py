"""alert_delivery (issue 15): where each alert's latest notification stands at each sink

One row per (alert, sink): the event sent (firing, escalated, resolved), pending / retrying /
delivered / failed, the attempts so far and the last error, so `lldmon alerts list` and the API can say
what happened to a notification. Downgrading drops the table (the alerts themselves stay).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_deliveries",
        sa.Column("alert_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("sink", sa.String(length=128), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'retrying', 'delivered', 'failed')",
            name=op.f("ck_alert_deliveries_status"),
        ),
        sa.ForeignKeyConstraint(
            ["alert_id"],
            ["alerts.id"],
            name=op.f("fk_alert_deliveries_alert_id_alerts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("alert_id", "sink", name=op.f("pk_alert_deliveries")),
    )


def downgrade() -> None:
    op.drop_table("alert_deliveries")
