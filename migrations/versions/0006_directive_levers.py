"""directive levers: checkpoint and stop requests, stop-on-collapse, who set LLDS

A directive version now also carries the id of the latest checkpoint request and of the standing stop
request (the version that made each; 0: none), the stop's reason, whether the run opted in to a stop on
collapse, and `llds_manual` (a person set LLDS in this or an earlier version: the detector leaves LLDS
alone from then on, while a person's checkpoint or stop request no longer counts as such). Existing
rows get no requests, stop-on-collapse off, and `llds_manual` true from the run's first manual version
on (before this revision every manual version set LLDS). Downgrading drops the columns (requests and
stop-on-collapse are lost; upgrading again counts every manual version as setting LLDS).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("directives", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checkpoint", sa.BigInteger(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("stop", sa.BigInteger(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("stop_reason", sa.Text(), server_default="", nullable=False))
        batch_op.add_column(
            sa.Column("stop_on_collapse", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch_op.add_column(sa.Column("llds_manual", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.execute(
        sa.text(
            "UPDATE directives SET llds_manual = EXISTS (SELECT 1 FROM directives AS m "
            "WHERE m.run_id = directives.run_id AND m.version <= directives.version AND m.source = 'manual')"
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("directives", schema=None) as batch_op:
        batch_op.drop_column("llds_manual")
        batch_op.drop_column("stop_on_collapse")
        batch_op.drop_column("stop_reason")
        batch_op.drop_column("stop")
        batch_op.drop_column("checkpoint")
