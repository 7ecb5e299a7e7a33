"""What the dashboard reads, through monitor's services only (never SQL, never `monitor.store`).

Every call passes the caller's Principal, so project scoping and auth are the API's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from monitor.domain import Principal, RunContext, RunFilter, RunInfo, Series
from monitor.ports import DashboardPort

RUNS_LIMIT = 500


def series_map(
    state: DashboardPort,
    principal: Principal,
    run_id: int,
    names: Sequence[str],
    *,
    step_min: int | None = None,
    step_max: int | None = None,
    max_points: int | None = None,
) -> dict[str, Series]:
    """The named series of a run (only those with rows), optionally downsampled (spikes kept)."""
    if not names:
        return {}
    series = state.query.history(principal, run_id, list(names), step_min, step_max, max_points)
    return {s.name: s for s in series}


def signature(rc: RunContext) -> str:
    """Changes whenever a band, marker or marker hover drawn from `rc` would change."""
    parts = [
        ",".join(f"{e.id}" for e in rc.phases),
        ",".join(f"{a.id}:{a.status}:{a.last_step}" for a in rc.alerts),
        ",".join(f"{d.version}:{d.applied_step}" for d in rc.directives),  # acks show in the timeline
        ",".join(f"{r.id}" for r in rc.rollbacks),
    ]
    return "|".join(parts)


def run_context(state: DashboardPort, principal: Principal, run_id: int) -> RunContext:
    """The run and what is drawn over its series, in one read (`QueryService.context`)."""
    return state.query.context(principal, run_id)


@dataclass(frozen=True)
class RunRow:
    run: RunInfo
    open_alerts: int


def list_runs(
    state: DashboardPort,
    principal: Principal,
    *,
    project: str | None = None,
    status: str | None = None,
    tag: str | None = None,
    search: str | None = None,
) -> list[RunRow]:
    """Runs the principal may see, filtered; `search` matches name, project or a tag (case-insensitive)."""
    runs = state.runs.list(
        principal,
        RunFilter(project=project or None, status=status or None, tag=tag or None, limit=RUNS_LIMIT),
    )
    needle = (search or "").strip().lower()
    if needle:
        runs = [
            r
            for r in runs
            if needle in r.name.lower()
            or needle in r.project.lower()
            or any(needle in t.lower() for t in r.tags)
        ]
    counts = state.alerts.unresolved_counts(runs)  # open or acknowledged, one query for all runs
    return [RunRow(run=r, open_alerts=counts[r.id]) for r in runs]


def runs_named(
    state: DashboardPort, principal: Principal, name: str, project: str | None = None
) -> list[RunInfo]:
    """The runs the principal may see with exactly this name (one per project at most), optionally of
    one project."""
    return state.runs.list(principal, RunFilter(project=project, name=name, limit=RUNS_LIMIT))


def projects(state: DashboardPort, principal: Principal) -> list[str]:
    return sorted({r.project for r in state.runs.list(principal, RunFilter(limit=RUNS_LIMIT))})


def run_options(state: DashboardPort, principal: Principal) -> list[dict[str, object]]:
    """Dropdown options for picking runs: "project / name (#id)"."""
    runs = state.runs.list(principal, RunFilter(limit=RUNS_LIMIT))
    return [{"label": f"{r.project} / {r.name} (#{r.id})", "value": r.id} for r in runs]
