"""rollbacks: the rollback lever and the `heal` policy

The directive gains the rollback lever (`rollback`: a request id as `checkpoint` and `stop` are;
`rollback_to`: restore the newest checkpoint at or before this step; `lr_scale`: a factor on the
learning rate the job started with). `rollbacks` records each rollback a trainer carried out (from which
step to which checkpoint, for which directive version) with the phase events of the steps it undid. The
directive policy may be `heal` (`auto` plus a rollback when the run enters collapse). Downgrading turns
`heal` runs into `auto` ones (the old schema has no such policy) and drops the rollback records and
columns.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_OLD = "directive_policy IN ('off', 'alert', 'auto')"
_NEW = "directive_policy IN ('off', 'alert', 'auto', 'heal')"
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_runs_directive_policy"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_runs_directive_policy"), _NEW)
    with op.batch_alter_table("directives", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rollback", sa.BigInteger(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("rollback_to", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("lr_scale", sa.Double(), server_default="1.0", nullable=False))
    op.create_table(
        "rollbacks",
        sa.Column("id", _BIG_ID, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("from_step", sa.BigInteger(), nullable=False),
        sa.Column("to_step", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("undone_phases", sa.JSON(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_rollbacks_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollbacks")),
    )
    op.create_index("ix_rollbacks_run_id_from_step", "rollbacks", ["run_id", "from_step"])


def downgrade() -> None:
    op.drop_index("ix_rollbacks_run_id_from_step", table_name="rollbacks")
    op.drop_table("rollbacks")
    with op.batch_alter_table("directives", schema=None) as batch_op:
        batch_op.drop_column("lr_scale")
        batch_op.drop_column("rollback_to")
        batch_op.drop_column("rollback")
    op.execute("UPDATE runs SET directive_policy = 'auto' WHERE directive_policy = 'heal'")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_runs_directive_policy"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_runs_directive_policy"), _OLD)
