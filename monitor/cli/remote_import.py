"""`lldmon import --url`: parse logs here, send their steps through a remote service's ingest API.

The batches are what a trainer sends (columnar metrics, gzip, split to the body limit with
`contracts.split`), and their ids are derived from the run, a digest of the input (files, format and
options) and the step range, so importing the same files again is a no-op: every batch is a duplicate on
the service's ledger. The service's detector judges the steps and raises alerts; its own sinks deliver
them. The summary (the run's phases and alerts, and how many of them this import recorded) is read back
from the API.

If sending stops part way (Ctrl-C, at the next batch boundary as locally; the service unreachable), a run
the import created is marked `failed`; a run that existed keeps its status (a live trainer's run stays
`running`; one that had ended is finished again with the status it had): an import does not end a run it
did not start.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.markup import escape

from contracts.wire import DEFAULT_PROJECT, IMPORT_BATCH_PREFIX
from lldmon_client import RetryPolicy, Uploader, masked, metrics_body, stable_batch_id
from monitor.cli.remote import RemoteState, run_of
from monitor.domain import AlertInfo, PhaseEventInfo, Principal, RunFilter, RunInfo
from monitor.errors import Conflict, LLDMonError
from monitor.import_command import (
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_USAGE,
    DeferredInterrupt,
    ImportOptions,
    named,
    read_input,
    steps_progress,
    summary,
)

DEFAULT_CHUNK_STEPS: Final = 50
_BATCH_NAMESPACE: Final = "lldmon:import-batch"
_FINAL_STATUSES: Final = ("finished", "failed", "crashed")


@dataclass(frozen=True)
class RemoteImportResult:
    """What `import_command.summary` prints (the fields of the local ImportResult it reads): phases
    and alerts are those this import recorded, opened or updated."""

    run: RunInfo
    created: bool
    steps: int
    first_step: int
    last_step: int
    points: int
    metrics: tuple[str, ...]
    phases: list[PhaseEventInfo] = field(default_factory=list)
    alerts: list[AlertInfo] = field(default_factory=list)


def input_digest(files: Sequence[Path], options: ImportOptions, fmt: str) -> str:
    """SHA-256 of the input files' bytes and of what changes how they parse."""
    digest = hashlib.sha256(f"{fmt}|{list(options.first_step)}|".encode())
    for path in files:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def batch_id(run_id: int, digest: str, first_step: int, last_step: int) -> str:
    """Stable for the same run, input and step range: a re-sent batch is a duplicate."""
    key = f"{run_id}:{digest}:{first_step}-{last_step}"
    return stable_batch_id(_BATCH_NAMESPACE, key, prefix=IMPORT_BATCH_PREFIX)


def log_body(log: Any, lo: int, hi: int, batch: str) -> dict[str, Any]:
    """Steps `lo:hi` of the log as a metrics body: the names logged in them, sorted."""
    columns = {
        name: masked(log.values[name][lo:hi], log.present[name][lo:hi])
        for name in sorted(log.values)
        if log.present[name][lo:hi].any()
    }
    return metrics_body(batch, log.steps[lo:hi], columns)


def _log_extent(log: Any) -> set[tuple[str, int, int, int]]:
    """(name, points, first step, last step) per metric, as the API's metric-names lists them."""
    out = set()
    for name, mask in log.present.items():
        steps = log.steps[mask]
        if len(steps):
            out.add((name, len(steps), int(steps[0]), int(steps[-1])))
    return out


def import_over_http(options: ImportOptions, console: Console, url: str, token: str | None) -> int:
    """The whole `import --url`; returns the exit code."""
    if options.replace:
        return _fail(console, "--replace deletes the run's data in the database: local only, not with --url")
    read = read_input(options, console)
    if isinstance(read, int):
        return read
    log, fmt, files = read
    options = named(options, log)
    digest = input_digest(files, options, fmt)
    state = RemoteState(url, token)
    sender = _Sender(state)
    try:
        result = _send(state, sender, options, log, digest, console)
        held = state.query.summary(Principal(), result.run.id)
    except LLDMonError as exc:
        code = _fail(console, exc.message, EXIT_REFUSED)
        if sender.fate is not None:
            console.print(
                f"stopped after {sender.sent + sender.duplicates} batches: run {escape(options.run)!r} "
                f"{sender.fate}; run the same command with --append to send the rest (the batches already "
                "sent are duplicates)",
                highlight=False,
                soft_wrap=True,
            )
        return code
    except KeyboardInterrupt:
        console.print(
            f"interrupted after {sender.sent + sender.duplicates} batches: run {escape(options.run)!r} "
            f"{sender.fate or 'may be left running'}; run the same command with --append to send the rest "
            "(the batches already sent are duplicates)",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_INTERRUPTED
    finally:
        state.dispose()
    console.print(
        f"sent {sender.sent} batches to {state.api.base_url}"
        + (f" ({sender.duplicates} already there)" if sender.duplicates else ""),
        highlight=False,
        soft_wrap=True,
    )
    summary(result, fmt, len(files), console, held)
    return 0


def _send(
    state: RemoteState, sender: _Sender, options: ImportOptions, log: Any, digest: str, console: Console
) -> RemoteImportResult:
    principal = Principal()  # the service applies the token's scope
    project = options.project or (None if state.api.has_token else DEFAULT_PROJECT)
    found = [
        r
        for r in state.runs.list(principal, RunFilter(name=options.run, project=project, limit=2))
        if r.name == options.run
    ]
    existing = found[0] if len(found) == 1 else None
    if existing is not None and existing.last_step is not None and not options.append:
        stored = {
            (m.name, m.points, m.first_step, m.last_step)
            for m in state.query.metric_names(principal, existing.id)
        }
        if stored != _log_extent(log):  # not this import again: the local import's refusal
            raise Conflict(
                f"run {options.run!r} of project {existing.project!r} (id {existing.id}) already has metrics "
                f"up to step {existing.last_step}: append the log to them (--append; a step stored already "
                "is overwritten) or import into a new run (--replace is local only)"
            )
    body: dict[str, Any] = {"name": options.run, "tags": list(options.tags)}
    if options.project is not None:
        body["project"] = options.project
    run = state.api.json("POST", "/runs", json=body, decode=run_of)
    phases_before = {e.id for e in state.query.phase_events(principal, run.id)}
    alerts_before = {(a.id, a.status, a.last_step) for a in state.alerts.list(principal, run.id)}
    chunk = options.chunk_steps or DEFAULT_CHUNK_STEPS
    previous = existing.status if existing is not None else None
    with steps_progress(console) as progress, DeferredInterrupt() as interrupt:
        task = progress.add_task("write", total=len(log))
        try:
            for lo in range(0, len(log), chunk):
                hi = min(lo + chunk, len(log))
                first, last = int(log.steps[lo]), int(log.steps[hi - 1])
                sender.send(run.id, log_body(log, lo, hi, batch_id(run.id, digest, first, last)))
                progress.advance(task, hi - lo)
                interrupt.check()
        except BaseException:
            sender.fate = _after_stop(state, run.id, previous)
            raise
    if previous is None or previous in _FINAL_STATUSES:  # a live run (running, stalled) stays live
        final = "finished" if previous in (None, "failed") else previous
        state.api.json("POST", f"/runs/{run.id}/finish", json={"status": final})
    return RemoteImportResult(
        run=state.runs.get(principal, run.id),
        created=existing is None,
        steps=len(log),
        first_step=int(log.steps[0]),
        last_step=int(log.steps[-1]),
        points=log.n_points,
        metrics=tuple(sorted(log.values)),
        phases=[e for e in state.query.phase_events(principal, run.id) if e.id not in phases_before],
        alerts=[
            a
            for a in state.alerts.list(principal, run.id)
            if (a.id, a.status, a.last_step) not in alerts_before
        ],
    )


def _after_stop(state: RemoteState, run_id: int, previous: str | None) -> str:
    """After sending stopped part way, as the local import: a run the import created is marked failed
    (not left looking alive); a run that existed is not ended by it: a live one (running, stalled) is
    left running, an ended one gets back the status it had. Best effort (the service may be what
    failed); returns what became of the run, for the message."""
    status = "failed" if previous is None else previous if previous in _FINAL_STATUSES else None
    if status is None:
        return f"left running (it was {previous}; this import did not start it, so it does not end it)"
    try:
        state.api.json("POST", f"/runs/{run_id}/finish", json={"status": status})
    except Exception:
        return f"could not be marked {status} (check it with `lldmon runs show`)"
    if previous is None:
        return "marked failed"
    return f"left {status} (this import did not start it, so it does not end it)"


class _Sender:
    """Metrics bodies to the ingest API (`lldmon_client.Uploader`: gzip, split to the body limit, the
    one a 413 names); an answer that is no success raises its domain error."""

    def __init__(self, state: RemoteState) -> None:
        self.api = state.api
        self.uploader = Uploader(state.api.session, retry=RetryPolicy(attempts=1))
        self.sent = self.duplicates = 0
        self.fate: str | None = None
        """What became of the run after sending stopped part way (None: it did not stop)."""

    def send(self, run_id: int, body: dict[str, Any]) -> None:
        outcome = self.uploader.send(run_id, "metrics", body)
        for sent in outcome.delivered:
            ack = self.api.acknowledged(sent.reply)
            if ack.get("duplicate"):
                self.duplicates += 1
            else:
                self.sent += 1
        if outcome.failure is not None:
            raise self.api.failure(outcome.failure)


def _fail(console: Console, message: str, code: int = EXIT_USAGE) -> int:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return code
