"""What importing a log into a run needs beyond ingest: find the run without touching it, tell whether it
holds metrics, and clear everything it stored before a `--replace`."""

from __future__ import annotations

from sqlalchemy import Connection, delete, exists, select, update

from monitor.db.models import (
    ActionBlock,
    Alert,
    Directive,
    IngestBatch,
    PhaseEvent,
    Project,
    Run,
    StepMetric,
)
from monitor.domain import RunInfo
from monitor.store import runs as run_store
from monitor.store._sql import table_of

runs = table_of(Run)
projects = table_of(Project)
step_metrics = table_of(StepMetric)

RUN_DATA_TABLES = tuple(
    table_of(model) for model in (StepMetric, ActionBlock, PhaseEvent, Alert, Directive, IngestBatch)
)
"""Everything a run accumulates from ingest and detection (the run row, its tags and settings excepted)."""


def find_run(conn: Connection, project: str, name: str) -> RunInfo | None:
    """The run of that name in that project, read only (registration would mark it running)."""
    run_id = conn.execute(
        select(runs.c.id)
        .join(projects, projects.c.id == runs.c.project_id)
        .where(projects.c.name == project, runs.c.name == name)
    ).scalar_one_or_none()
    return None if run_id is None else run_store.get_run(conn, int(run_id))


def has_metrics(conn: Connection, run_id: int) -> bool:
    return bool(conn.execute(select(exists().where(step_metrics.c.run_id == run_id))).scalar())


def clear_run_data(conn: Connection, run_id: int) -> None:
    """Delete the run's metrics, actions, phase events, alerts, directives, batch ledger and detector
    state; its name, project, config, tags, directive policy and detector overrides stay."""
    for table in RUN_DATA_TABLES:
        conn.execute(delete(table).where(table.c.run_id == run_id))
    conn.execute(
        update(runs).where(runs.c.id == run_id).values(detector_state=None, phase=None, last_step=None)
    )
