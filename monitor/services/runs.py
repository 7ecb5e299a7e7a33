"""Run registration, listing and lifecycle, scoped by the caller's project."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Final

from contracts.wire import DEFAULT_PROJECT, DIRECTIVE_POLICIES, FINISH_STATUSES, RUN_STATUSES
from monitor.domain import Principal, RunFilter, RunInfo
from monitor.errors import Forbidden, InvalidInput
from monitor.services.auth import accessible_run
from monitor.store import Database
from monitor.store import runs as run_store

MAX_CONFIG_DEPTH: Final = run_store.MAX_CONFIG_DEPTH
MAX_CONFIG_BYTES: Final = 256 * 1024
"""Encoded size a run config may have: it is returned with every listing of its run."""


def config_problem(config: Any) -> str | None:
    """Why `config` cannot be stored (nested too deeply, too large), or None."""
    clean, too_deep = run_store.bounded_json(config)
    if too_deep is not None:
        return f"config is nested deeper than {MAX_CONFIG_DEPTH} levels (at {too_deep})"
    size = len(json.dumps(clean, ensure_ascii=False).encode("utf-8", "surrogatepass"))  # text: checked later
    if size > MAX_CONFIG_BYTES:
        return f"config is {size} bytes as JSON, more than the {MAX_CONFIG_BYTES} allowed"
    return None


def checked_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config as it will be stored (non-finite floats as "NaN", "Infinity", "-Infinity" on every
    database), or InvalidInput naming `config` if it is nested too deeply or too large."""
    problem = config_problem(config)
    if problem is not None:
        raise InvalidInput(problem, field="config")
    clean: dict[str, Any] = run_store.bounded_json(config)[0]
    return clean


class RunService:
    def __init__(self, db: Database) -> None:
        self.db = db

    def register(
        self,
        principal: Principal,
        name: str,
        project: str | None,
        config: dict[str, Any],
        tags: list[str],
    ) -> tuple[RunInfo, bool]:
        """Create the run or return the existing one of that name in the project."""
        config = checked_config(config)
        if not principal.unrestricted:
            if project is not None and project != principal.project:
                raise Forbidden(f"this token belongs to project {principal.project!r}, not {project!r}")
            project = principal.project
        with self.db.write() as conn:
            project_id = run_store.get_or_create_project(conn, project or DEFAULT_PROJECT)
            return run_store.create_run(conn, project_id, name, config, tags)

    def get(self, principal: Principal, run_id: int) -> RunInfo:
        with self.db.read() as conn:
            return accessible_run(principal, run_id, lambda i: run_store.get_run(conn, i))

    def list(self, principal: Principal, flt: RunFilter) -> list[RunInfo]:
        if flt.status is not None and flt.status not in RUN_STATUSES:
            raise InvalidInput(f"status must be one of {list(RUN_STATUSES)}", field="status")
        if not principal.unrestricted:
            flt = replace(flt, project_ids=[principal.project_id])  # type: ignore[list-item]
        with self.db.read() as conn:
            return run_store.list_runs(conn, flt)

    def finish(self, principal: Principal, run_id: int, status: str) -> RunInfo:
        """An explicit finish: final, a later batch or heartbeat does not revive the run."""
        if status not in FINISH_STATUSES:
            raise InvalidInput(f"status must be one of {list(FINISH_STATUSES)}", field="status")
        self.get(principal, run_id)
        with self.db.write() as conn:
            run_store.finish_run(conn, run_id, status)
        return self.get(principal, run_id)

    def mark_failed(self, principal: Principal, run_id: int) -> RunInfo:
        """`failed`, not final: what a writer that stopped part way (an interrupted import) makes of a run
        it started, so the run does not look alive; a job that does write to it revives it."""
        self.get(principal, run_id)
        with self.db.write() as conn:
            run_store.finish_run(conn, run_id, "failed", final=False)
        return self.get(principal, run_id)

    def status_snapshot(self, run_id: int) -> run_store.StatusSnapshot | None:
        with self.db.read() as conn:
            return run_store.status_snapshot(conn, run_id)

    def restore_status(self, run_id: int, snapshot: run_store.StatusSnapshot) -> bool:
        """Put the status back as `snapshot` unless the run was finished since (`store.runs.restore_status`)."""
        with self.db.write() as conn:
            return run_store.restore_status(conn, run_id, snapshot)

    def set_policy(self, principal: Principal, run_id: int, policy: str) -> RunInfo:
        if policy not in DIRECTIVE_POLICIES:
            raise InvalidInput(f"policy must be one of {list(DIRECTIVE_POLICIES)}", field="policy")
        self.get(principal, run_id)
        with self.db.write() as conn:
            run_store.set_directive_policy(conn, run_id, policy)
        return self.get(principal, run_id)
