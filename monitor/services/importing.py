"""Import a parsed trainer log into a run, through the same ingest path and detector as a live run.

The log's steps are written in step order, `chunk_steps` steps per batch, each batch through
`IngestService.ingest_metrics`: one transaction with its ledger entry, then the online detector over the
new steps. Phases are the same whatever the chunk size (the detector judges each step on its own window);
alerts differ only in when a short episode inside one chunk resolves (with the next chunk, as online).

A run that already holds metrics is refused unless the caller says what to do with them:
- `append`: keep them; the log's steps are added and a step stored already is overwritten (later wins,
  as when a trainer resumes). As online, the detector judges only steps after the last one it has seen.
- `replace`: first delete the run's metrics, actions, phases, alerts, directives and detector state (its
  config, tags, policy and detector overrides stay), then import as into a new run.
Parsing happens before anything is written, so a malformed file in strict mode leaves the database as it
was. If writing stops part way (Ctrl-C, a database error), the batches before stay (`ImportInterrupted`,
`ImportFailed` say how far it got), and what becomes of the run depends on who started it:
- a run the import started (created it, or emptied it with `replace` while no job was writing to it) is
  marked `failed`, never left looking alive. Not finally: a job that does write to it revives it.
- any other run keeps the status it had (a live trainer's run stays `running`): an import never ends a
  run it did not start.
Importing again with `replace` (or `append`) completes it; a complete import leaves a run it created
`finished`, a `failed` run `finished`, and any other run with the status it had.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from contracts.wire import BATCH_ID_MAX_LENGTH, DEFAULT_PROJECT, IMPORT_BATCH_PREFIX
from monitor.domain import AlertInfo, MetricsColumns, PhaseEventInfo, Principal, RunInfo
from monitor.errors import Conflict, InvalidInput, LLDMonError
from monitor.importers.parsed import ParsedLog
from monitor.services.alerts import AlertService
from monitor.services.auth import check_access
from monitor.services.ingest import IngestService
from monitor.services.query import QueryService
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import imports as import_store
from monitor.store import runs as run_store

ImportMode = Literal["new", "append", "replace"]
IMPORT_MODES: Final = ("new", "append", "replace")
DEFAULT_CHUNK_STEPS: Final = 50
"""Steps per ingest batch. Online a batch usually holds one step; 50 keeps a 10,000-step import short."""


@dataclass(frozen=True)
class ImportStop:
    """How far an import that stopped part way got: the log's first `written` of `total` steps are
    stored; `run` is re-read after `marked_failed` (the import started it) or after its status was left
    as it was (it did not)."""

    run: RunInfo
    written: int
    total: int
    mode: ImportMode
    marked_failed: bool


class ImportInterrupted(KeyboardInterrupt):
    """Ctrl-C while writing (`stop`: how far it got). A KeyboardInterrupt still, for callers that only
    know that."""

    def __init__(self, stop: ImportStop) -> None:
        super().__init__(
            f"import into run {stop.run.id} interrupted after {stop.written} of {stop.total} steps"
        )
        self.stop = stop


class ImportFailed(LLDMonError):
    """A domain error while writing (the database went away): the error's own message and code, and
    `stop`, how far the import got."""

    def __init__(self, error: LLDMonError, stop: ImportStop) -> None:
        super().__init__(error.message, field=error.field)
        self.status_code = error.status_code
        self.code = error.code
        self.stop = stop


@dataclass(frozen=True)
class ImportResult:
    run: RunInfo
    """The run after the import."""
    created: bool
    steps: int
    first_step: int
    last_step: int
    points: int
    """Metric values written (NaN and inf included)."""
    metrics: tuple[str, ...]
    batches: int
    phases: list[PhaseEventInfo] = field(default_factory=list)
    """Phase changes the detector recorded during the import, in step order."""
    alerts: list[AlertInfo] = field(default_factory=list)
    """Alerts the import opened or updated."""


class ImportService:
    def __init__(
        self, db: Database, runs: RunService, ingest: IngestService, query: QueryService, alerts: AlertService
    ) -> None:
        self.db = db
        self.runs = runs
        self.ingest = ingest
        self.query = query
        self.alerts = alerts

    def import_log(
        self,
        principal: Principal,
        log: ParsedLog,
        *,
        name: str,
        project: str | None = None,
        mode: ImportMode = "new",
        config: dict[str, Any] | None = None,
        tags: Sequence[str] = (),
        chunk_steps: int = DEFAULT_CHUNK_STEPS,
        on_steps: Callable[[int], None] | None = None,
    ) -> ImportResult:
        """Write `log` into the run `project`/`name` (created if missing); `on_steps(n)` after each batch."""
        if mode not in IMPORT_MODES:
            raise InvalidInput(f"mode must be one of {list(IMPORT_MODES)}", field="mode")
        if chunk_steps < 1:
            raise InvalidInput("chunk_steps must be at least 1", field="chunk_steps")
        if not name:
            raise InvalidInput("a run name is needed", field="name")
        if log.n_points == 0:
            raise InvalidInput("the log holds no metric values: nothing to import", field="log")
        project_name = (
            project or (principal.project if not principal.unrestricted else None) or DEFAULT_PROJECT
        )
        with self.db.read() as conn:
            existing = import_store.find_run(conn, project_name, name)
            has_data = existing is not None and import_store.has_metrics(conn, existing.id)
        if existing is not None:
            check_access(principal, existing)
        if existing is not None and has_data and mode == "new":
            raise Conflict(
                f"run {name!r} of project {project_name!r} (id {existing.id}) already has metrics up to step "
                f"{existing.last_step}: append the log to them (--append; a step stored already is "
                "overwritten) or delete them first (--replace)",
                field="run",
            )
        before = None if existing is None else self.runs.status_snapshot(existing.id)
        run, created = self.runs.register(principal, name, project_name, config or {}, list(tags))
        # The import owns the run's status only if the run is its own: one it created, or one whose
        # data it deletes while no job is writing to it. Any other run it leaves as it found it.
        owned = before is None or (mode == "replace" and before.status not in run_store.LIVE)
        if mode == "replace" and has_data:
            with self.db.write() as conn:
                import_store.clear_run_data(conn, run.id)
        phases_before = {e.id for e in self.query.phase_events(principal, run.id)}
        alerts_before = {(a.id, a.status, a.last_step) for a in self.alerts.list(principal, run.id)}

        batch_prefix = f"{IMPORT_BATCH_PREFIX}{uuid.uuid4().hex[:12]}-"
        batches = written = 0
        try:
            for lo in range(0, len(log), chunk_steps):
                hi = min(lo + chunk_steps, len(log))
                batch = chunk_columns(log, lo, hi)
                batch_id = f"{batch_prefix}{batches:06d}"
                assert len(batch_id) <= BATCH_ID_MAX_LENGTH
                self.ingest.ingest_metrics(principal, run.id, batch_id, batch)
                batches += 1
                written = hi
                if on_steps is not None:
                    on_steps(hi - lo)  # where a caller stops the import between chunks (Ctrl-C)
        except BaseException as exc:
            stop = self._stop(principal, run, None if owned else before, written, len(log), mode)
            if stop is not None and isinstance(exc, KeyboardInterrupt):
                raise ImportInterrupted(stop) from None
            if stop is not None and isinstance(exc, LLDMonError):
                raise ImportFailed(exc, stop) from exc
            raise

        self.ingest.judge_backlog(run.id)  # a chunk over the detector's per-batch bound
        if before is None or before.status == "failed":  # new, or what an interrupted import left
            self.runs.finish(principal, run.id, "finished")
        else:
            self.runs.restore_status(run.id, before)
        phases = [e for e in self.query.phase_events(principal, run.id) if e.id not in phases_before]
        alerts = [
            a
            for a in self.alerts.list(principal, run.id)
            if (a.id, a.status, a.last_step) not in alerts_before
        ]
        return ImportResult(
            run=self.runs.get(principal, run.id),
            created=created,
            steps=len(log),
            first_step=int(log.steps[0]),
            last_step=int(log.steps[-1]),
            points=log.n_points,
            metrics=tuple(sorted(log.values)),
            batches=batches,
            phases=phases,
            alerts=alerts,
        )

    def _stop(
        self,
        principal: Principal,
        run: RunInfo,
        keep: run_store.StatusSnapshot | None,
        written: int,
        total: int,
        mode: ImportMode,
    ) -> ImportStop | None:
        """After writing stopped: mark the run failed (`keep` None: the import's own run) or put back the
        status `keep` it had. Best effort (the database may be what failed): None if that failed too."""
        with contextlib.suppress(Exception):
            if keep is None:
                marked = self.runs.mark_failed(principal, run.id)
            else:
                self.runs.restore_status(run.id, keep)
                marked = self.runs.get(principal, run.id)
            return ImportStop(marked, written, total, mode, marked_failed=keep is None)
        return None


def chunk_columns(log: ParsedLog, lo: int, hi: int) -> MetricsColumns:
    """Steps `lo:hi` of the log as an ingest batch: logged values only, NaN as None (its storage form)."""
    steps: list[int] = []
    names: list[str] = []
    values: list[float | None] = []
    window = log.steps[lo:hi]
    for name in sorted(log.values):
        mask = log.present[name][lo:hi]
        if not mask.any():
            continue
        chosen = window[mask].tolist()
        steps += chosen
        names += [name] * len(chosen)
        values += [None if math.isnan(v) else v for v in log.values[name][lo:hi][mask].tolist()]
    return MetricsColumns(steps=steps, names=names, values=values)
