"""Retention of raw action records: old blocks lose their payload, keep their per-step summary.

Pruning is one idempotent `UPDATE ... SET payload = NULL WHERE updated_at < :cutoff AND payload IS NOT
NULL`, so several server processes pruning at once only ever prune each block once (on PostgreSQL a
concurrent pruner waits for the row lock and then re-checks `payload IS NOT NULL`; a writer that merged
new records into a block meanwhile has moved its `updated_at` past the cutoff). `updated_at` is left as
it was: the age of the data, not of the pruning.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, select, update
from sqlalchemy.sql.elements import ColumnElement

from monitor.db.models import ActionBlock
from monitor.store._sql import table_of

action_blocks = table_of(ActionBlock)


@dataclass(frozen=True)
class PruneResult:
    """Blocks whose payload was dropped (or would be, in a dry run) and the records they held."""

    blocks: int
    records: int


def _prunable(older_than: datetime, run_id: int | None) -> ColumnElement[bool]:
    condition = (action_blocks.c.updated_at < older_than) & action_blocks.c.payload.is_not(None)
    if run_id is not None:
        condition = (action_blocks.c.run_id == run_id) & condition
    return condition


def count_prunable(conn: Connection, older_than: datetime, run_id: int | None = None) -> PruneResult:
    """What `prune_actions` would drop now (the dry run: reads only)."""
    blocks, records = conn.execute(
        select(func.count(), func.coalesce(func.sum(action_blocks.c.n_records), 0)).where(
            _prunable(older_than, run_id)
        )
    ).one()
    return PruneResult(int(blocks), int(records))


def prune_actions(conn: Connection, older_than: datetime, run_id: int | None = None) -> PruneResult:
    """Drop the payload of every action block (of `run_id`, or of all runs) last written before
    `older_than`; its summary and `n_records` stay, so quantiles over steps still cover it."""
    pruned = conn.execute(
        update(action_blocks)
        .where(_prunable(older_than, run_id))
        # an explicit value keeps any `onupdate` of the column from stamping the prune time on it
        .values(payload=None, updated_at=action_blocks.c.updated_at)
        .returning(action_blocks.c.n_records)
    ).all()
    return PruneResult(len(pruned), sum(int(n) for (n,) in pruned))
