"""ingest ledger keyed by (run, kind, batch id) with a payload digest

A metrics batch and an actions batch may share an id (each kind has its own ledger), and a re-sent id
is compared by digest: same payload -> duplicate, other payload -> 409. Existing rows keep a NULL
digest (any re-send of them stays a duplicate, as before). Downgrading drops the digests and, where a
metrics and an actions batch of one run share an id, the actions entry (the old key holds only one).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ingest_batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("digest", sa.String(length=64), nullable=True))
        batch_op.drop_constraint("pk_ingest_batches", type_="primary")
        batch_op.create_primary_key("pk_ingest_batches", ["run_id", "kind", "batch_id"])


def downgrade() -> None:
    op.execute(
        "DELETE FROM ingest_batches WHERE kind = 'actions' AND EXISTS ("
        "SELECT 1 FROM ingest_batches AS m WHERE m.run_id = ingest_batches.run_id "
        "AND m.batch_id = ingest_batches.batch_id AND m.kind = 'metrics')"
    )
    with op.batch_alter_table("ingest_batches", schema=None) as batch_op:
        batch_op.drop_constraint("pk_ingest_batches", type_="primary")
        batch_op.create_primary_key("pk_ingest_batches", ["run_id", "batch_id"])
        batch_op.drop_column("digest")
