"""`lldmon import`: read trainer logs, write them into a run through the ingest path, print what the
detector found.

Parsing comes first and completely (with a bytes progress bar for large inputs); the database is only
opened afterwards, so `--strict` on a malformed file, a missing file or an unknown format leave it
untouched. The CLI opens the service state with webhook and Slack sinks off unless `--notify` is given: an
old log should not page anyone.

Ctrl-C while writing stops the import at the next chunk boundary (`DeferredInterrupt`), never inside a
chunk's write, where it could leave a database connection mid-command; a second Ctrl-C stops at once
(the store then discards the connection it interrupted). Either way the command exits 130 and says what
became of the run: marked `failed` if the import started it, its status kept otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Final

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from contracts import metrics as M

MAX_WARNINGS: Final = 20
"""Malformed lines printed one by one; the rest are counted."""
PROGRESS_MIN_BYTES: Final = 8 << 20
"""Inputs smaller than this are read without a progress bar (it would only flash)."""
ALERT_LOGGER: Final = "lldmon.alerts"
EXIT_MALFORMED: Final = 1
EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
"""128 + SIGINT, as a shell reports a command stopped by Ctrl-C."""
DEFERRED_NOTICE: Final = "Ctrl-C: stopping after the chunk being written (press it again to stop at once)"


@dataclass(frozen=True)
class ImportOptions:
    paths: Sequence[Path]
    run: str
    """Empty: the name the log records for its run (a lab fixture's header), see `named`."""
    project: str | None = None
    fmt: str = "auto"
    strict: bool = False
    append: bool = False
    replace: bool = False
    first_step: Sequence[int] = ()
    tags: Sequence[str] = ()
    chunk_steps: int | None = None
    notify: bool = False


class DeferredInterrupt:
    """While active, SIGINT is recorded, not raised: `check()`, called between chunks, raises the
    KeyboardInterrupt there. A KeyboardInterrupt raised anywhere (inside a PostgreSQL COPY, inside
    psycopg's wait for the server) can leave a connection mid-command, so that rolling back or marking
    the run fails or hangs. A second SIGINT before that boundary raises at once (the user insists); once
    `check()` has raised, further ones are ignored so that marking the run runs to its end. The previous
    handler is restored on exit. A no-op outside the main thread, or where SIGINT is ignored (a job
    started in the background keeps ignoring it) or handled outside Python."""

    def __init__(self) -> None:
        self.requested = False
        self.raised = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous not in (signal.SIG_IGN, None):  # None: set outside Python, cannot be restored
                self._previous = signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.raised:
            return
        if self.requested:
            self.raised = True
            raise KeyboardInterrupt
        self.requested = True
        # From a signal handler: a plain write to stderr, not through rich's console (which the
        # interrupted code may be in the middle of).
        with contextlib.suppress(OSError):
            os.write(2, f"\n{DEFERRED_NOTICE}\n".encode())

    def check(self) -> None:
        """Raise the KeyboardInterrupt a SIGINT asked for, once."""
        if self.requested and not self.raised:
            self.raised = True
            raise KeyboardInterrupt


def run_import(options: ImportOptions, console: Console, open_state: Callable[[], Any]) -> int:
    """The whole command; returns the exit code. `open_state` builds the service state (the CLI's own
    settings and database handling); it is called only once the input has parsed."""
    from monitor.errors import LLDMonError

    read = read_input(options, console)
    if isinstance(read, int):
        return read
    log, fmt, files = read
    options = named(options, log)
    from monitor.services.importing import ImportFailed, ImportInterrupted

    try:
        state = open_state()
    except KeyboardInterrupt:
        console.print("interrupted while opening the database: nothing was written", highlight=False)
        return EXIT_INTERRUPTED
    try:
        with _quiet_alert_log(not options.notify):
            return _write(options, log, fmt, len(files), state, console)
    except ImportFailed as failed:
        code = _fail(console, failed.message, EXIT_REFUSED)
        _stopped("stopped", failed.stop, console)
        return code
    except LLDMonError as exc:
        return _fail(console, exc.message, EXIT_REFUSED)
    except ImportInterrupted as interrupted:
        _stopped("interrupted", interrupted.stop, console)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        console.print(
            f"interrupted: the import into run {escape(options.run)!r} stopped part way; check it with "
            "`lldmon runs show` and import again with --replace",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_INTERRUPTED
    finally:
        state.dispatcher.close()
        state.db.dispose()


def read_input(options: ImportOptions, console: Console) -> tuple[Any, str, list[Path]] | int:
    """Parse the input completely before anything is written: (log, format, files), or the exit code
    after a one-line error."""
    from monitor.importers import (
        NAMING_FORMATS,
        LogImportError,
        MalformedLog,
        input_files,
        load_log,
        resolve_format,
    )

    if options.append and options.replace:
        return _fail(console, "--append and --replace exclude each other", EXIT_USAGE)
    try:
        fmt = resolve_format(list(options.paths), options.fmt)
        if not options.run and fmt not in NAMING_FORMATS:
            return _fail(console, f"--run NAME is needed: a {fmt} log does not name its run", EXIT_USAGE)
        files = input_files(options.paths, fmt)
        total = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
        with _bytes_progress(console, total, f"reading {len(files)} file(s) ({fmt})") as advance:
            log = load_log(
                options.paths,
                fmt,
                strict=options.strict,
                progress=advance,
                first_step=list(options.first_step) or None,
            )
    except MalformedLog as exc:
        return _fail(console, f"{exc} (--strict: nothing was written)", EXIT_MALFORMED)
    except (LogImportError, OSError) as exc:
        return _fail(console, str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        console.print("interrupted while reading the input: nothing was written", highlight=False)
        return EXIT_INTERRUPTED

    for diagnostic in log.diagnostics[:MAX_WARNINGS]:
        console.print(f"[yellow]warning:[/yellow] {escape(str(diagnostic))}", highlight=False, soft_wrap=True)
    if len(log.diagnostics) > MAX_WARNINGS:
        console.print(
            f"[yellow]warning:[/yellow] … and {len(log.diagnostics) - MAX_WARNINGS} more malformed lines "
            f"({len(log.diagnostics)} in all, skipped)"
        )
    elif log.diagnostics:
        console.print(f"{len(log.diagnostics)} malformed line(s) skipped (--strict to stop at the first)")
    if log.n_points == 0:
        return _fail(console, "no metric values found in the input: nothing to import", EXIT_USAGE)
    if not options.run and not log.run_name:
        return _fail(console, f"--run NAME is needed: the {fmt} file(s) name no single run", EXIT_USAGE)
    return log, fmt, [Path(f) for f in files]


def named(options: ImportOptions, log: Any) -> ImportOptions:
    """The options with the run's name: `--run`, else the one the log records (`read_input` checked)."""
    return options if options.run else dataclasses.replace(options, run=log.run_name)


def _stopped(what: str, stop: Any, console: Console) -> None:
    """One line: how far the import got, what became of the run (marked failed if the import started
    it, its status kept if not) and the command that completes it (the same files again: --append keeps
    what the run held before, --replace starts over)."""
    run = stop.run
    how = "--append" if stop.mode == "append" else "--replace"
    fate = (
        "marked failed"
        if stop.marked_failed
        else f"left {run.status} (this import did not start it, so it does not end it)"
    )
    console.print(
        f"{what}: run {run.id} {escape(run.name)!r} of project {escape(run.project)!r} {fate}, with "
        f"{stop.written:,} of {stop.total:,} steps of the log written; run the same command with {how} to "
        "import it completely",
        highlight=False,
        soft_wrap=True,
    )


def _write(options: ImportOptions, log: Any, fmt: str, n_files: int, state: Any, console: Console) -> int:
    from monitor.domain import Principal
    from monitor.services.importing import DEFAULT_CHUNK_STEPS, ImportMode, ImportService

    service = ImportService(state.db, state.runs, state.ingest, state.query, state.alerts)
    mode: ImportMode = "replace" if options.replace else "append" if options.append else "new"
    with steps_progress(console) as progress, DeferredInterrupt() as interrupt:
        task = progress.add_task("write", total=len(log))

        def written(n: int) -> None:
            progress.advance(task, n)
            interrupt.check()

        result = service.import_log(
            Principal(),
            log,
            name=options.run,
            project=options.project,
            mode=mode,
            tags=list(options.tags),
            chunk_steps=options.chunk_steps or DEFAULT_CHUNK_STEPS,
            on_steps=written,
        )
    summary(result, fmt, n_files, console, state.query.summary(Principal(), result.run.id))
    return 0


def steps_progress(console: Console) -> Progress:
    """The progress bar of the steps an import writes (locally or over HTTP)."""
    return Progress(
        TextColumn("writing steps"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    )


def summary(result: Any, fmt: str, n_files: int, console: Console, held: Any) -> None:
    """What was imported, then what the run holds after it (`held`, its RunSummary read after the import):
    its phases and alerts, not only those this import recorded, since importing the same steps again
    (--append, or `--url` with the same files) records nothing new for a run that has both. When the run
    had phase changes or alerts before, the heading says how many of them this import recorded."""
    run = held.run
    canonical = [m for m in result.metrics if m in M.CANONICAL_METRICS]
    console.print(
        f"imported {result.steps} steps ({result.first_step}-{result.last_step}), {result.points} values of "
        f"{len(result.metrics)} metrics from {n_files} {fmt} file(s) into run {run.id} "
        f"{escape(run.name)!r} of project {escape(run.project)!r}"
        f" ({'new run' if result.created else 'existing run'}, {run.status})",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"canonical metrics: {', '.join(canonical) or 'none'}", highlight=False)
    phases = held.phases
    if phases:
        console.print(
            _heading("phases", len(result.phases), len(phases), "changes recorded"), highlight=False
        )
        if phases[0].previous_phase == "warmup":  # the state every run starts in: no event
            first = held.first_step if held.first_step is not None else result.first_step
            console.print(f"  {'warmup':<11} from step {first}", highlight=False)
        for event in phases:
            console.print(f"  {event.phase:<11} from step {event.step}", highlight=False)
    else:
        console.print("phases: none recorded")
    console.print(f"current phase: {run.phase or 'none'}", highlight=False)
    if not held.alerts:
        console.print("alerts: none")
        return
    console.print(
        _heading("alerts", len(result.alerts), len(held.alerts), "opened or updated"), highlight=False
    )
    for a in held.alerts:
        console.print(
            f"  #{a.id} {a.severity} {a.kind} ({a.status}) steps {a.first_step}-{a.last_step}: "
            f"{escape(a.message)}",
            highlight=False,
            soft_wrap=True,
        )


def _heading(what: str, new: int, held: int, verb: str) -> str:
    """`phases:` when the import recorded all the run holds, else `phases (1 of 3 changes recorded by
    this import):`."""
    if new >= held:
        return f"{what}:"
    return f"{what} ({new or 'none'} of {held} {verb} by this import):"


@contextmanager
def _bytes_progress(console: Console, total: int, label: str) -> Iterator[Any]:
    """A bytes progress bar for large inputs; yields the callback to advance it (or None)."""
    if total < PROGRESS_MIN_BYTES:
        yield None
        return
    columns = (
        TextColumn(escape(label)),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("read", total=total)
        yield lambda n: progress.advance(task, n)


@contextmanager
def _quiet_alert_log(quiet: bool) -> Iterator[None]:
    """The log sink would repeat every alert on stderr while the summary lists them anyway."""
    logger = logging.getLogger(ALERT_LOGGER)
    disabled = logger.disabled
    logger.disabled = disabled or quiet
    try:
        yield
    finally:
        logger.disabled = disabled


def _fail(console: Console, message: str, code: int) -> int:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    return code
