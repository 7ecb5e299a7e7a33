"""Projects and runs.

Run configs are free-form JSON. They are stored in strict JSON (non-finite floats as the wire strings
"NaN", "Infinity", "-Infinity", which PostgreSQL's json type requires and SQLite would otherwise keep
as tokens that read back as NaN) and read defensively: a row stored before depth was validated must
not break every listing of its project (pydantic refuses to serialise ~255 levels, json ~1000).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

from sqlalchemy import Connection, Row, Text, and_, bindparam, case, cast, func, select, update

from contracts.wire import RUN_CRASHED, RUN_STALLED, encode_float
from monitor.db.models import Project, Run, RunTag
from monitor.domain import RunFilter, RunInfo
from monitor.store._sql import insert_ignore, table_of

projects = table_of(Project)
runs = table_of(Run)
run_tags = table_of(RunTag)

STEP_INTERVALS_KEPT: Final = 32
"""Recent seconds-per-step observations kept per run (their median scales its stall threshold)."""
REVIVABLE: Final = (RUN_STALLED, RUN_CRASHED, "failed")
"""Statuses a new batch or heartbeat turns back into `running` (the job is evidently alive), unless an
explicit finish set them (`status_final`): a job that said it ended stays ended, while the liveness
sweeper's `stalled`/`crashed` and an interrupted import's `failed` are judgements from outside the job."""
LIVE: Final = ("running", RUN_STALLED)
"""Statuses the liveness sweeper watches and /metrics reports per run."""

MAX_CONFIG_DEPTH: Final = 32
"""Nesting levels a run config may have (the config object itself is level 1)."""
TOO_DEEP: Final = f"<nested deeper than {MAX_CONFIG_DEPTH} levels: not shown>"
"""Stands in, on reads, for what lies deeper than MAX_CONFIG_DEPTH in a config stored before the check."""
UNREADABLE: Final = {"<lldmon>": "stored config could not be read (nested too deeply)"}

# The config is read as text and parsed here, so one over-deep row cannot fail the whole query.
_RUN_COLUMNS = (
    *(c for c in runs.c if c.name != "config"),
    cast(runs.c.config, Text).label("config_text"),
    projects.c.name.label("project_name"),
)


def bounded_json(value: Any, max_depth: int = MAX_CONFIG_DEPTH) -> tuple[Any, str | None]:
    """`value` in strict JSON form (non-finite floats as wire strings, tuples as lists) with every
    container deeper than `max_depth` replaced by TOO_DEEP; and the path of the first one replaced
    (`config.a[0]`), None if nothing was. Recursion is bounded by `max_depth`, never by the input."""
    first: list[str] = []

    def walk(v: Any, depth: int, path: str) -> Any:
        if isinstance(v, float):
            return encode_float(v)
        if not isinstance(v, (dict, list, tuple)):
            return v
        if depth > max_depth:
            if not first:
                first.append(path)
            return TOO_DEEP
        if isinstance(v, dict):
            return {str(k): walk(item, depth + 1, f"{path}.{k}") for k, item in v.items()}
        return [walk(item, depth + 1, f"{path}[{i}]") for i, item in enumerate(v)]

    out = walk(value, 1, "config")
    return out, (first[0] if first else None)


def _config_of(text: str | None) -> dict[str, Any]:
    """A stored config for reading: parsed here (see _RUN_COLUMNS), bounded, non-finite floats as strings."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except RecursionError:
        return dict(UNREADABLE)
    value, _ = bounded_json(value)
    return value if isinstance(value, dict) else {}


def get_or_create_project(conn: Connection, name: str) -> int:
    insert_ignore(conn, projects, {"name": name})
    project_id = conn.execute(select(projects.c.id).where(projects.c.name == name)).scalar_one()
    return int(project_id)


def create_run(
    conn: Connection, project_id: int, name: str, config: dict[str, Any], tags: list[str]
) -> tuple[RunInfo, bool]:
    """Create the run, or return the existing one of that name (re-registration after a restart).

    An existing run is marked running again and gains any new tags; its config is kept.
    """
    created = insert_ignore(
        conn,
        runs,
        {"project_id": project_id, "name": name, "config": bounded_json(config)[0], "status": "running"},
    )
    run_id = conn.execute(
        select(runs.c.id).where(runs.c.project_id == project_id, runs.c.name == name)
    ).scalar_one()
    if not created:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(
                status="running",
                status_final=False,
                finished_at=None,
                last_seen_at=datetime.now(timezone.utc),
            )
        )
    for tag in dict.fromkeys(tags):
        insert_ignore(conn, run_tags, {"run_id": run_id, "tag": tag})
    run = get_run(conn, int(run_id))
    assert run is not None
    return run, created


def get_run(conn: Connection, run_id: int) -> RunInfo | None:
    row = conn.execute(
        select(*_RUN_COLUMNS).join(projects, projects.c.id == runs.c.project_id).where(runs.c.id == run_id)
    ).one_or_none()
    if row is None:
        return None
    return _to_run(row, _tags_of(conn, [run_id]).get(run_id, []))


def list_runs(conn: Connection, flt: RunFilter) -> list[RunInfo]:
    query = select(*_RUN_COLUMNS).join(projects, projects.c.id == runs.c.project_id)
    if flt.project is not None:
        query = query.where(projects.c.name == flt.project)
    if flt.project_ids is not None:
        query = query.where(runs.c.project_id.in_(flt.project_ids))
    if flt.status is not None:
        query = query.where(runs.c.status == flt.status)
    if flt.name is not None:
        query = query.where(runs.c.name == flt.name)
    if flt.tag is not None:
        query = query.where(runs.c.id.in_(select(run_tags.c.run_id).where(run_tags.c.tag == flt.tag)))
    query = query.order_by(runs.c.id.desc()).limit(flt.limit).offset(flt.offset)
    rows = conn.execute(query).all()
    tags = _tags_of(conn, [r.id for r in rows])
    return [_to_run(r, tags.get(r.id, [])) for r in rows]


def finish_run(conn: Connection, run_id: int, status: str, *, final: bool = True) -> None:
    """End the run with `status`. `final`: an explicit finish, which no later batch or heartbeat undoes;
    otherwise the run's next batch or heartbeat turns it back into `running` (`REVIVABLE`)."""
    conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(status=status, status_final=final, finished_at=func.now())
    )


@dataclass(frozen=True)
class StatusSnapshot:
    """A run's lifecycle fields, to put back as they were (`restore_status`)."""

    status: str
    final: bool
    finished_at: datetime | None


def status_snapshot(conn: Connection, run_id: int) -> StatusSnapshot | None:
    row = conn.execute(
        select(runs.c.status, runs.c.status_final, runs.c.finished_at).where(runs.c.id == run_id)
    ).one_or_none()
    return None if row is None else StatusSnapshot(str(row.status), bool(row.status_final), row.finished_at)


def restore_status(conn: Connection, run_id: int, snapshot: StatusSnapshot) -> bool:
    """Compare-and-set: put `snapshot` back if the run is still as (re-)registration left it (running,
    not finished explicitly); a finish meanwhile wins. True if this call restored it."""
    result = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == "running", runs.c.status_final.is_(False))
        .values(status=snapshot.status, status_final=snapshot.final, finished_at=snapshot.finished_at)
        .returning(runs.c.id)
    )
    return result.first() is not None


@dataclass(frozen=True)
class RunActivity:
    """A run as a batch's transaction reads it, once: whose it is (the caller's access check) and what
    `touch_run` updates from."""

    id: int
    project_id: int
    status: str
    status_final: bool
    last_step: int | None
    last_step_at: datetime | None
    step_intervals: list[Any] | None


_ACTIVITY = select(
    runs.c.id,
    runs.c.project_id,
    runs.c.status,
    runs.c.status_final,
    runs.c.last_step,
    runs.c.last_step_at,
    runs.c.step_intervals,
).where(runs.c.id == bindparam("run_id"))
"""Built once: a batch's run read is on every request's path."""


def read_activity(conn: Connection, run_id: int) -> RunActivity | None:
    """The run's owner and activity fields (None: no such run)."""
    row = conn.execute(_ACTIVITY, {"run_id": run_id}).one_or_none()
    if row is None:
        return None
    return RunActivity(
        int(row.id),
        int(row.project_id),
        str(row.status),
        bool(row.status_final),
        row.last_step,
        row.last_step_at,
        row.step_intervals,
    )


def touch_run(
    conn: Connection,
    run_id: int,
    last_step: int | None,
    seen: RunActivity | None = None,
    first_step: int | None = None,
) -> str | None:
    """Record activity (a batch): revive the run (`REVIVABLE`), note when a new last step arrived and its
    seconds per step; `last_step` only ever grows. Returns the status the run had (None: no run).

    `first_step`: a metrics batch's first step; if it is at or below the run's last step, the batch
    rewrote or completed history, and `history_rev` counts it (compared with the stored last step in the
    UPDATE itself, under the row lock, so a concurrent batch that raised it is seen).

    `seen`: the run as this transaction already read it (`read_activity`), so it is not read twice. The
    update applies only while the status is still the one it was judged from; if it changed in between
    (the liveness sweeper marked the run stalled), the run is read again and judged anew."""
    run = seen if seen is not None else read_activity(conn, run_id)
    while run is not None:
        statement = (
            update(runs)
            .where(runs.c.id == run_id, runs.c.status == run.status)
            .values(**_touch_values(conn, run, last_step), **_history_values(first_step))
        )
        if conn.execute(statement).rowcount:
            return run.status
        run = read_activity(conn, run_id)
    return None


def _touch_values(conn: Connection, run: RunActivity, last_step: int | None) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    values: dict[str, Any] = {"last_seen_at": now, **_revive(run.status, run.status_final)}
    if last_step is not None and (run.last_step is None or last_step > run.last_step):
        values["last_step_at"] = now
        if run.last_step is not None and run.last_step_at is not None:
            per_step = (now - run.last_step_at).total_seconds() / (last_step - run.last_step)
            kept = [float(x) for x in (run.step_intervals or []) if isinstance(x, (int, float))]
            if math.isfinite(per_step) and per_step >= 0:
                values["step_intervals"] = [*kept, per_step][-STEP_INTERVALS_KEPT:]
    if last_step is not None:
        # GREATEST ignores NULL on PostgreSQL; SQLite's two-argument max() does not.
        values["last_step"] = (
            func.max(func.coalesce(runs.c.last_step, last_step), last_step)
            if conn.dialect.name == "sqlite"
            else func.greatest(runs.c.last_step, last_step)
        )
    return values


def _history_values(first_step: int | None) -> dict[str, Any]:
    if first_step is None:
        return {}
    rewrites = and_(runs.c.last_step.is_not(None), runs.c.last_step >= first_step)
    return {"history_rev": case((rewrites, runs.c.history_rev + 1), else_=runs.c.history_rev)}


def _revive(status: str, final: bool) -> dict[str, Any]:
    return {"status": "running", "finished_at": None} if status in REVIVABLE and not final else {}


@dataclass(frozen=True)
class RunLiveness:
    """What the liveness sweeper needs of a run."""

    id: int
    project: str
    name: str
    status: str
    last_step: int | None
    last_seen_at: datetime
    last_step_at: datetime | None
    stall_after_s: float | None
    crash_after_s: float | None
    step_intervals: list[float]


def heartbeat(conn: Connection, run_id: int) -> bool | None:
    """The job is alive between steps: refresh `last_seen_at` and revive the run (`REVIVABLE`).
    Returns whether it was revived (None: no run)."""
    row = conn.execute(select(runs.c.status, runs.c.status_final).where(runs.c.id == run_id)).one_or_none()
    if row is None:
        return None
    revive = _revive(str(row.status), bool(row.status_final))
    conn.execute(
        update(runs).where(runs.c.id == run_id).values(last_seen_at=datetime.now(timezone.utc), **revive)
    )
    return bool(revive)


def liveness(conn: Connection, run_ids: list[int] | None = None) -> list[RunLiveness]:
    """Liveness state of the given runs, or of every running and stalled run."""
    query = select(
        runs.c.id,
        projects.c.name.label("project_name"),
        runs.c.name,
        runs.c.status,
        runs.c.last_step,
        runs.c.last_seen_at,
        runs.c.last_step_at,
        runs.c.stall_after_s,
        runs.c.crash_after_s,
        runs.c.step_intervals,
    ).join(projects, projects.c.id == runs.c.project_id)
    query = query.where(runs.c.status.in_(LIVE) if run_ids is None else runs.c.id.in_(run_ids))
    return [
        RunLiveness(
            id=int(r.id),
            project=str(r.project_name),
            name=str(r.name),
            status=str(r.status),
            last_step=r.last_step,
            last_seen_at=r.last_seen_at,
            last_step_at=r.last_step_at,
            stall_after_s=r.stall_after_s,
            crash_after_s=r.crash_after_s,
            step_intervals=[float(x) for x in (r.step_intervals or []) if isinstance(x, (int, float))],
        )
        for r in conn.execute(query.order_by(runs.c.id)).all()
    ]


def set_liveness_thresholds(
    conn: Connection, run_id: int, stall_after_s: float | None, crash_after_s: float | None
) -> None:
    conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(stall_after_s=stall_after_s, crash_after_s=crash_after_s)
    )


def mark_silent(conn: Connection, run_id: int, was: str, now_status: str, seen_at: datetime) -> bool:
    """Compare-and-set: move the run from `was` to `now_status` only if it is still in `was` and was not
    seen since `seen_at` (a batch or heartbeat in between wins). True if this call made the change, so
    of several sweepers (one per API worker) exactly one raises the alert."""
    values: dict[str, Any] = {"status": now_status}
    if now_status == RUN_CRASHED:
        values["finished_at"] = datetime.now(timezone.utc)
    result = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, runs.c.status == was, runs.c.last_seen_at <= seen_at)
        .values(**values)
        .returning(runs.c.id)
    )
    return result.first() is not None


def set_directive_policy(conn: Connection, run_id: int, policy: str) -> None:
    conn.execute(update(runs).where(runs.c.id == run_id).values(directive_policy=policy))


def count_by_status(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(runs.c.status, func.count()).group_by(runs.c.status)).all()
    return {str(status): int(n) for status, n in rows}


def _tags_of(conn: Connection, run_ids: list[int]) -> dict[int, list[str]]:
    if not run_ids:
        return {}
    out: dict[int, list[str]] = defaultdict(list)
    rows = conn.execute(
        select(run_tags.c.run_id, run_tags.c.tag)
        .where(run_tags.c.run_id.in_(run_ids))
        .order_by(run_tags.c.tag)
    )
    for run_id, tag in rows:
        out[int(run_id)].append(str(tag))
    return out


def _to_run(row: Row[Any], tags: list[str]) -> RunInfo:
    return RunInfo(
        id=row.id,
        project=row.project_name,
        project_id=row.project_id,
        name=row.name,
        config=_config_of(row.config_text),
        tags=tags,
        status=row.status,
        directive_policy=row.directive_policy,
        phase=row.phase,
        last_step=row.last_step,
        created_at=row.created_at,
        last_seen_at=row.last_seen_at,
        finished_at=row.finished_at,
    )


def running_phases(conn: Connection) -> list[tuple[int, str, str, str, datetime | None]]:
    """(run id, project, run name, phase, last step time) of every running or stalled run."""
    rows = conn.execute(
        select(runs.c.id, projects.c.name, runs.c.name, runs.c.phase, runs.c.last_step_at)
        .join(projects, projects.c.id == runs.c.project_id)
        .where(runs.c.status.in_(LIVE))
        .order_by(runs.c.id)
    ).all()
    return [(int(i), str(pr), str(n), str(p or "warmup"), t) for i, pr, n, p, t in rows]
