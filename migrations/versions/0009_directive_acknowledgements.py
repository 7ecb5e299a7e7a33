"""directive acknowledgements: the step at which the trainer acknowledged each directive version

A trainer acknowledges a version with the metric `directive/applied_version`. The acknowledgement is
now judged when its batch is ingested (a value above the run's current version, or not a whole
positive finite number, acknowledges nothing; an import's values are history) and recorded on the
versions it covers as `applied_step`, the first step whose acknowledgement covered them. Existing rows
get the first step whose stored value covers their version, as the service read it before this
revision (values above the versions of their time cannot be told apart any more; versions made after
this revision need an acknowledgement of their own). Downgrading drops the column (the metric values
stay, so the service before this revision reads them as before).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("directives", schema=None) as batch_op:
        batch_op.add_column(sa.Column("applied_step", sa.BigInteger(), nullable=True))
    # `value < 9.2e18` leaves out +inf and PostgreSQL's NaN (greater than every number there);
    # SQLite stores NaN as NULL.
    op.execute(
        sa.text(
            "UPDATE directives SET applied_step = (SELECT min(m.step) FROM step_metrics AS m "
            "WHERE m.run_id = directives.run_id AND m.name = 'directive/applied_version' "
            "AND m.value >= directives.version AND m.value < 9.2e18)"
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("directives", schema=None) as batch_op:
        batch_op.drop_column("applied_step")
