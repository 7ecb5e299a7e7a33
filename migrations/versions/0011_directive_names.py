"""directive names: the directives table names its columns as the directive does everywhere else

`directives.llds_lambda` becomes `llds_lam` (the directive's `llds.lam` on the wire and in
`contracts.directive`) and `directives.created_at` becomes `updated_at` (the API's name for when a
version was made, i.e. when the run's directive last changed). Only names change: the values, the
server default of the timestamp and the constraints stay. Downgrading renames them back.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

RENAMES = (("llds_lambda", "llds_lam"), ("created_at", "updated_at"))
"""(name before this revision, name after it)."""


def _rename(pairs: tuple[tuple[str, str], ...]) -> None:
    with op.batch_alter_table("directives", schema=None) as batch_op:
        for old, new in pairs:
            batch_op.alter_column(old, new_column_name=new)


def upgrade() -> None:
    _rename(RENAMES)


def downgrade() -> None:
    _rename(tuple((new, old) for old, new in RENAMES))
