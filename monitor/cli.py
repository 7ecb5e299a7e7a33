"""`lldmon` command line: serve, db, token, runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from contracts.directive import DEFAULT_LLDS_LAMBDA
from monitor.lab.cli import lab_app as _lab_app
from monitor.serving import DEFAULT_KEEP_ALIVE, DEFAULT_REQUEST_TIMEOUT

app = typer.Typer(help="lldmon: collapse diagnostics for GRPO agent training.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema migrations.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens (auth is on once one was created).", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect runs.", no_args_is_help=True)
alerts_app = typer.Typer(help="List and acknowledge alerts.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(alerts_app, name="alerts")
app.add_typer(token_app, name="token")
app.add_typer(runs_app, name="runs")
app.add_typer(_lab_app, name="lab")

console = Console()
# Enumerated options are Literal choices: a typo is a one-line usage error (exit 2), never a traceback or
# an empty answer. The same values as contracts.wire's RUN_STATUSES and DIRECTIVE_POLICIES (a test checks).
RunStatus = Literal["running", "finished", "failed", "crashed", "stalled"]
AlertStatus = Literal["open", "acknowledged", "resolved"]
Policy = Literal["off", "alert", "auto"]

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url", envvar="LLDMON_DATABASE_URL", help="SQLAlchemy URL (default: embedded SQLite)."
    ),
]
DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", envvar="LLDMON_DATA_DIR", help="Directory of the embedded SQLite file."),
]


def _settings(database_url: str | None, data_dir: Path | None, **extra: Any) -> Any:
    from monitor.config import Settings

    values: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if database_url:
        values["database_url"] = database_url
    if data_dir:
        values["data_dir"] = data_dir
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return Settings(**values)
    except ValidationError as exc:  # a bad LLDMON_* variable: one line naming it, not a traceback
        error = exc.errors()[0]
        name = "LLDMON_" + str(error["loc"][0]).upper() if error["loc"] else "settings"
        console.print(f"[red]error:[/red] {name}: {error['msg']}", highlight=False)
        raise typer.Exit(2) from None
    except SettingsError as exc:  # e.g. LLDMON_WEBHOOK_URLS that is not a JSON list
        console.print(f"[red]error:[/red] {exc} (lists are JSON: '[\"https://...\"]')", highlight=False)
        raise typer.Exit(2) from None


@app.command()
def serve(
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
    host: Annotated[str | None, typer.Option(envvar="LLDMON_HOST")] = None,
    port: Annotated[
        int | None, typer.Option(envvar="LLDMON_PORT", min=0, max=65535, help="0: any free port.")
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes (PostgreSQL only).")] = 1,
    timeout_keep_alive: Annotated[
        int,
        typer.Option(
            envvar="LLDMON_TIMEOUT_KEEP_ALIVE",
            min=1,
            help="Seconds an idle keep-alive connection stays open.",
        ),
    ] = DEFAULT_KEEP_ALIVE,
    timeout_request: Annotated[
        float,
        typer.Option(
            envvar="LLDMON_TIMEOUT_REQUEST",
            min=0.1,
            help="Seconds a client has to send a request head, and the longest pause inside a body.",
        ),
    ] = DEFAULT_REQUEST_TIMEOUT,
) -> None:
    """Run the API (upgrades an empty or outdated embedded SQLite first).

    The port is bound before the service is announced: a busy port is an error here, not in a log.
    """
    from monitor.api.app import SchemaOutdated, create_app
    from monitor.serving import bind
    from monitor.serving import serve as serve_app

    settings = _settings(database_url, data_dir, host=host, port=port)
    if workers > 1 and settings.is_sqlite:
        console.print("[red]error:[/red] --workers > 1 needs PostgreSQL (SQLite allows one writer)")
        raise typer.Exit(2)
    try:
        application = create_app(settings)
    except SchemaOutdated as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    try:
        sock = bind(settings.host, settings.port)
    except OSError as exc:
        application.state.lldmon.db.dispose()
        reason = (exc.strerror or str(exc)).lower()
        console.print(f"[red]error:[/red] cannot listen on {settings.host}:{settings.port}: {reason}")
        raise typer.Exit(2) from None
    host_text = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host_text}:{sock.getsockname()[1]}"
    console.print(f"lldmon serving on [bold]{url}[/bold]  (API docs: {url}/docs)", soft_wrap=True)
    console.print(f"database: {_redact(settings.resolved_database_url())}", soft_wrap=True)
    timeouts: dict[str, Any] = {"keep_alive": timeout_keep_alive, "request_timeout": timeout_request}
    with sock:
        if workers > 1:
            application.state.lldmon.db.dispose()
            # Worker processes build their settings from the environment (monitor.api.factory).
            os.environ["LLDMON_DATABASE_URL"] = settings.resolved_database_url()
            serve_app("monitor.api.factory:app", sock, factory=True, workers=workers, **timeouts)
            return
        serve_app(application, sock, log_level=settings.log_level, **timeouts)


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseUrl = None, data_dir: DataDir = None, revision: str = "head") -> None:
    """Apply migrations up to REVISION (default: head)."""
    from monitor.db.engine import make_engine
    from monitor.db.migrate import upgrade

    url = _settings(database_url, data_dir).resolved_database_url()
    make_engine(url).dispose()  # creates the SQLite data directory
    upgrade(url, revision)
    console.print(f"database at {revision}: {_redact(url)}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision, e.g. base.")],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Revert migrations down to REVISION."""
    from monitor.db.migrate import downgrade

    downgrade(_settings(database_url, data_dir).resolved_database_url(), revision)
    console.print(f"database at {revision}")


@db_app.command("current")
def db_current(database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    """Print the schema revision of the database and of the code."""
    from monitor.db.engine import make_engine
    from monitor.db.migrate import current_revision, head_revision

    engine = make_engine(_settings(database_url, data_dir).resolved_database_url())
    console.print(f"database: {current_revision(engine) or 'empty'}  code: {head_revision()}")
    engine.dispose()


def _services(database_url: str | None, data_dir: Path | None, **extra: Any) -> Any:
    from monitor.api.app import SchemaOutdated, build_state

    try:
        return build_state(_settings(database_url, data_dir, **extra))
    except SchemaOutdated as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


@token_app.command("create")
def token_create(
    project: Annotated[str, typer.Option(help="Project the token may read and write.")],
    name: Annotated[str, typer.Option(help="A label for the token.")] = "",
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Mint a token. It is printed once and stored only as a hash."""
    state = _services(database_url, data_dir)
    token, token_id = state.auth.create_token(project, name)
    console.print(f"token {token_id} for project {project!r} (shown once):", style="bold")
    typer.echo(token)


@token_app.command("list")
def token_list(database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    state = _services(database_url, data_dir)
    table = Table("id", "project", "name", "prefix", "created", "revoked")
    for t in state.auth.list_tokens():
        table.add_row(
            str(t.id), t.project, t.name, t.prefix + "…", str(t.created_at), str(t.revoked_at or "")
        )
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: int, database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    from monitor.errors import NotFound

    state = _services(database_url, data_dir)
    try:
        state.auth.revoke(token_id)
        status = state.auth.status()
    except NotFound as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    finally:
        state.db.dispose()
    typer.echo(f"token {token_id} revoked")
    if not status.active:  # the last one: say that the API is now locked, not open
        typer.echo(status.describe())


auth_app = typer.Typer(help="Whether the API needs tokens; switching auth off again.", no_args_is_help=True)
app.add_typer(auth_app, name="auth")


@auth_app.command("status")
def auth_status(database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    """Say whether auth is on and why."""
    state = _services(database_url, data_dir)
    try:
        typer.echo(state.auth.status().describe())
    finally:
        state.db.dispose()


@auth_app.command("off")
def auth_off(
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Open the API to anyone who can reach it: deletes the revoked tokens (refused while one is active).

    Revoking every token keeps auth on; this is the only way to switch it off again.
    """
    from monitor.errors import Conflict

    state = _services(database_url, data_dir)
    try:
        status = state.auth.status()
        if not status.enabled:
            typer.echo("auth is already off: no token exists")
            return
        if not (yes or status.active):  # with an active token turn_off refuses: nothing to confirm
            typer.confirm("Open the API to anyone who can reach it?", abort=True)
        deleted = state.auth.turn_off()
    except Conflict as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    finally:
        state.db.dispose()
    typer.echo(f"auth is off: deleted {deleted} revoked token(s); the API is open to anyone who can reach it")


@runs_app.command("list")
def runs_list(
    project: Annotated[str | None, typer.Option()] = None,
    status: Annotated[RunStatus | None, typer.Option(help="Only runs in this status.")] = None,
    tag: Annotated[str | None, typer.Option()] = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    from monitor.domain import Principal, RunFilter

    state = _services(database_url, data_dir)
    table = Table("id", "project", "name", "status", "phase", "last step", "last seen", "tags")
    with _closing(state):
        runs = state.runs.list(Principal(), RunFilter(project=project, status=status, tag=tag))
    for r in runs:
        table.add_row(
            str(r.id),
            r.project,
            r.name,
            r.status,
            r.phase or "",
            str(r.last_step or ""),
            str(r.last_seen_at),
            ",".join(r.tags),
        )
    console.print(table)


@contextmanager
def _closing(state: Any) -> Iterator[None]:
    """Close the database when the command is done; a domain error (unknown run or alert, a value out
    of bounds) becomes one line: exit 2 for bad input, 1 otherwise."""
    from rich.markup import escape

    from monitor.errors import InvalidInput, LLDMonError

    try:
        yield
    except LLDMonError as exc:
        console.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(2 if isinstance(exc, InvalidInput) else 1) from None
    finally:
        state.db.dispose()


def _run_id(state: Any, ref: str, project: str | None = None) -> int:
    """A run given by id, or by name (unique across projects, or within `project`)."""
    from rich.markup import escape

    from monitor.domain import Principal, RunFilter

    if ref.isdigit():
        return int(ref)
    matches = state.runs.list(Principal(), RunFilter(name=ref, project=project, limit=1000))
    where = f" in project {project!r}" if project is not None else ""
    if not matches:
        console.print(f"[red]error:[/red] no run is named {escape(repr(ref))}{escape(where)}")
        raise typer.Exit(1)
    if len(matches) > 1:
        projects = ", ".join(sorted(r.project for r in matches))
        console.print(
            f"[red]error:[/red] {len(matches)} runs are named {escape(repr(ref))} (projects: "
            f"{escape(projects)}); pass --project or use the run id"
        )
        raise typer.Exit(1)
    return int(matches[0].id)


ProjectOfRun = Annotated[
    str | None, typer.Option("--project", help="Project of the run, when its name is not unique.")
]


@runs_app.command("show")
def runs_show(
    run: Annotated[str, typer.Argument(help="Run id or name.")],
    project: ProjectOfRun = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (strict JSON).")] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Summary of a run: steps, last metric values, phases, alerts and directive history."""
    import json

    from rich.markup import escape

    from monitor.domain import Principal
    from monitor.errors import LLDMonError
    from monitor.run_report import render_summary, summary_json

    state = _services(database_url, data_dir)
    try:
        summary = state.query.summary(Principal(), _run_id(state, run, project))
    except LLDMonError as exc:
        console.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(1) from None
    finally:
        state.db.dispose()
    if as_json:
        typer.echo(json.dumps(summary_json(summary), indent=2, allow_nan=False))
    else:
        render_summary(summary, console)


@runs_app.command("liveness")
def runs_liveness(
    run: Annotated[str, typer.Argument(help="Run id or name.")],
    stall_after: Annotated[
        float | None, typer.Option("--stall-after", help="Seconds of silence before `stalled`.")
    ] = None,
    crash_after: Annotated[
        float | None, typer.Option("--crash-after", help="Seconds of silence before `crashed`.")
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Back to the service's default thresholds.")
    ] = False,
    project: ProjectOfRun = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Show or set how long a run may be silent (no batch, no heartbeat) before it is marked stalled
    (alert `run_stalled`) and crashed, e.g. `lldmon runs liveness grpo-7b --stall-after 600`."""
    from monitor.domain import Principal
    from monitor.services.liveness import LivenessService

    state = _services(database_url, data_dir)
    with _closing(state):
        service = LivenessService(state.db, state.runs, state.alerts, state.settings)
        run_id = _run_id(state, run, project)
        live = service.get(Principal(), run_id)
        if default or stall_after is not None or crash_after is not None:
            stall = None if default else stall_after if stall_after is not None else live.stall_after_s
            crash = None if default else crash_after if crash_after is not None else live.crash_after_s
            live = service.set_thresholds(Principal(), run_id, stall, crash)

    def source(value: float | None) -> str:
        return "set on the run" if value is not None else "default"

    console.print(
        f"run {run_id}: {live.status}, last seen {live.silent_s:.0f} s ago; stalled after "
        f"{live.effective_stall_after_s:g} s ({source(live.stall_after_s)}), crashed after "
        f"{live.effective_crash_after_s:g} s ({source(live.crash_after_s)})"
    )


@app.command("export")
def export_run(
    run: Annotated[str, typer.Argument(help="Run id or name.")],
    fmt: Annotated[
        str | None,
        typer.Option("--format", "-f", help="csv or parquet (default: from --output's suffix, else csv)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="File to write (default: run-<id>-metrics.<format>); '-': CSV to stdout."
        ),
    ] = None,
    metrics: Annotated[
        list[str] | None,
        typer.Option("--metrics", "-m", help="Metric names, comma-separated or repeated (default: all)."),
    ] = None,
    project: ProjectOfRun = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Write a run's metrics as a wide table: a step column and one column per metric.

    NaN and +-inf are kept (CSV: nan, inf, -inf); a step where a metric was not logged is an empty CSV
    cell or a Parquet null. The file is replaced atomically: an error never leaves a partial file.
    """
    from rich.markup import escape

    from monitor.services.export import EXPORT_FORMATS

    if fmt is None:
        fmt = "parquet" if output is not None and output.suffix in (".parquet", ".pq") else "csv"
    if fmt not in EXPORT_FORMATS:
        console.print(f"[red]error:[/red] --format must be csv or parquet, not {escape(repr(fmt))}")
        raise typer.Exit(2)
    names = [n.strip() for item in metrics or [] for n in item.split(",") if n.strip()] or None
    state = _services(database_url, data_dir)
    try:
        _export(state, run, project, fmt, output, names)
    finally:
        state.db.dispose()


def _export(
    state: Any, run: str, project: str | None, fmt: str, output: Path | None, names: list[str] | None
) -> None:
    from rich.markup import escape

    from monitor.domain import Principal
    from monitor.errors import LLDMonError
    from monitor.services.export import ExportService

    run_id = _run_id(state, run, project)
    exporter = ExportService(state.query)
    path = output or Path(f"run-{run_id}-metrics.{fmt}")
    try:
        if str(path) == "-":
            if fmt != "csv":
                console.print("[red]error:[/red] only CSV can go to stdout; pass --output FILE for parquet")
                raise typer.Exit(2)
            typer.echo(exporter.csv(Principal(), run_id, names), nl=False)
            return
        result = exporter.write(Principal(), run_id, fmt, path, names)
    except LLDMonError as exc:
        console.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(1) from None
    except OSError as exc:
        console.print(
            f"[red]error:[/red] cannot write {escape(str(path))}: {escape(exc.strerror or str(exc))}"
        )
        raise typer.Exit(1) from None
    console.print(
        f"wrote {escape(str(result.path))}: {result.rows} steps x {len(result.metrics)} metrics ({fmt})"
    )


@alerts_app.command("list")
def alerts_list(
    run: Annotated[str, typer.Argument(help="Run id or unique name.")],
    status: Annotated[AlertStatus | None, typer.Option(help="Only alerts in this status.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The API's alert objects, deliveries included (strict JSON).")
    ] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """The run's alerts; `delivery`: where each one's latest notification stands per sink."""
    import json

    from rich.markup import escape

    from monitor.api.schemas import AlertOut
    from monitor.domain import Principal

    state = _services(database_url, data_dir)
    with _closing(state):
        alerts = state.alerts.list(Principal(), _run_id(state, run), status)
    if as_json:
        typer.echo(json.dumps([AlertOut.of(a).model_dump(mode="json") for a in alerts], indent=2))
        return

    def describe(d: Any) -> str:  # "webhook:host/1a2b3c4d firing failed (5 attempts, ReadTimeout)"
        detail = [f"{d.attempts} attempts"] if d.attempts > 1 else []
        detail += [d.last_error] if d.last_error and d.status != "delivered" else []
        return f"{d.sink} {d.event} {d.status}" + (f" ({', '.join(detail)})" if detail else "")

    table = Table("id", "severity", "kind", "status", "steps", "message", "delivery")
    for a in alerts:
        delivery = "\n".join(describe(d) for d in a.deliveries)
        table.add_row(
            str(a.id),
            a.severity,
            a.kind,
            a.status,
            f"{a.first_step}-{a.last_step}",
            escape(a.message),
            escape(delivery or "-"),
        )
    console.print(table)


@alerts_app.command("ack")
def alerts_ack(
    run: Annotated[str, typer.Argument(help="Run id or unique name.")],
    alert_id: int,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Acknowledge an alert: no more re-notifications until it resolves."""
    from monitor.domain import Principal

    state = _services(database_url, data_dir)
    with _closing(state):
        alert = state.alerts.acknowledge(Principal(), _run_id(state, run), alert_id)
    console.print(f"alert {alert.id} ({alert.kind}) {alert.status}")


@app.command()
def directive(
    run: Annotated[str, typer.Argument(help="Run id or unique name.")],
    llds: Annotated[Literal["on", "off"] | None, typer.Option("--llds")] = None,
    lam: Annotated[
        float | None, typer.Option("--lambda", help=f"LLDS weight (paper: {DEFAULT_LLDS_LAMBDA}).")
    ] = None,
    checkpoint: Annotated[
        bool, typer.Option("--checkpoint", help="Ask the trainer to save a checkpoint now (once).")
    ] = False,
    stop: Annotated[
        bool | None,
        typer.Option(
            "--stop/--withdraw-stop", help="Ask the trainer to save and stop gracefully, or withdraw that."
        ),
    ] = None,
    stop_on_collapse: Annotated[
        Literal["on", "off"] | None,
        typer.Option("--stop-on-collapse", help="Request a stop when the run enters collapse."),
    ] = None,
    policy: Annotated[Policy | None, typer.Option(help="How far lldmon may steer the trainer.")] = None,
    reason: Annotated[str, typer.Option(help="Recorded with the change.")] = "",
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Show or change what the trainer is told (`--llds on --lambda 0.3`, `--checkpoint`, `--stop`,
    `--stop-on-collapse on`) and the run's policy; the trainer acknowledges each change in its next batch."""
    from monitor.domain import Principal

    state = _services(database_url, data_dir)
    with _closing(state):
        run_id = _run_id(state, run)
        if policy is not None:
            state.runs.set_policy(Principal(), run_id, policy)
        sets_llds = llds is not None or lam is not None
        if sets_llds or checkpoint or stop is not None or stop_on_collapse is not None:
            current = state.query.directive(Principal(), run_id)
            state.query.set_directive(
                Principal(),
                run_id,
                llds_enabled=(current.llds_enabled if llds is None else llds == "on") if sets_llds else None,
                llds_lambda=(current.llds_lambda if lam is None else lam) if sets_llds else None,
                checkpoint=checkpoint,
                stop=stop,
                stop_on_collapse=None if stop_on_collapse is None else stop_on_collapse == "on",
                reason=reason,
            )
        current = state.query.directive(Principal(), run_id)
        run_info = state.runs.get(Principal(), run_id)
    levers = [
        f"checkpoint request #{current.checkpoint}" if current.checkpoint else "",
        f"stop requested (#{current.stop}: {current.stop_reason})" if current.stop else "",
        "stop on collapse" if current.stop_on_collapse else "",
        f"acknowledged v{current.applied_version}" if current.applied_version else "not acknowledged yet",
    ]
    console.print(
        f"run {run_id}: policy {run_info.directive_policy}; directive v{current.version}: "
        f"LLDS {'on' if current.llds_enabled else 'off'}, lambda {current.llds_lambda} "
        f"({current.source}: {current.reason}); {'; '.join(x for x in levers if x)}",
        markup=False,
        soft_wrap=True,
    )


@app.command()
def sync(
    directory: Annotated[
        Path,
        typer.Argument(help="A client spool directory, or a folder above several (e.g. ~/.lldmon/spool)."),
    ],
    url: Annotated[str, typer.Option(envvar="LLDMON_URL", help="Base URL of the service.")] = (
        "http://127.0.0.1:8000"
    ),
    token: Annotated[
        str | None, typer.Option(envvar="LLDMON_TOKEN", help="API token, if auth is on.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per HTTP request.")] = 30.0,
) -> None:
    """Upload batches a training job spooled while the service was unreachable (oldest first).

    Idempotent: every batch keeps its batch_id, so one the service already has is a duplicate.
    Batches the service once refused (`rejected/`) are offered again first, and any batch over the
    service's body limit is split, so one refused only for its size is not lost; one still refused
    stays in `rejected/`. When every batch of a directory is delivered, its runs get the final
    status their job recorded (finished / failed / crashed). Stops at the first batch that cannot
    be delivered now; exit code 1 if any are left.
    """
    import httpx

    from contracts import spool
    from contracts.wire import API_PREFIX

    if not directory.is_dir():
        console.print(f"[red]error:[/red] {directory} is not a directory")
        raise typer.Exit(2)
    dirs = spool.find_spool_dirs(directory)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    stopped = False
    finished: set[tuple[str | None, str]] = set()
    base_url = url.strip().rstrip("/").removesuffix(API_PREFIX) + API_PREFIX  # ".../api/v1" works too
    with httpx.Client(base_url=base_url, headers=headers, timeout=timeout) as http:
        uploader = _SyncUploader(http, has_token=token is not None)
        for path in dirs:
            stopped = not uploader.resend_rejected(path)
            if stopped:
                break
            report = spool.replay(path, uploader.send)
            uploader.counts["rejected"] += report.rejected
            uploader.counts["corrupt"] += report.corrupt
            if report.rejected:
                console.print(f"{report.rejected} rejected batches kept in {path / spool.REJECTED_DIR}")
            if report.stopped:
                stopped = True
                break
            applied = uploader.apply_finishes(path)
            if applied is None:
                stopped = True
                break
            finished |= applied
    counts = uploader.counts
    remaining = sum(spool.spool_size(path)[0] for path in dirs)
    console.print(
        f"sent {counts['sent']}, duplicates {counts['duplicates']}, rejected {counts['rejected']}, "
        f"remaining {remaining}" + (f", corrupt {counts['corrupt']}" if counts["corrupt"] else "")
    )
    for key in [] if stopped else sorted(uploader.created - finished, key=str):
        console.print(
            f"run {key[1]!r}: the spool holds no final status (its job did not close its client): "
            "left 'running'"
        )
    if remaining or stopped:
        console.print(f"[yellow]stopped:[/yellow] {uploader.problem or 'not delivered'}")
        raise typer.Exit(1)


class _SyncUploader:
    """`lldmon sync`'s side of the wire: run ids by (project, name), batches cut to the service's
    body limit (the one a 413 names), rejected batches offered again, finish markers applied."""

    def __init__(self, http: Any, *, has_token: bool) -> None:
        from contracts import split

        self.http = http
        self.has_token = has_token
        self.run_ids: dict[tuple[str | None, str], int] = {}
        self.created: set[tuple[str | None, str]] = set()
        """Runs this sync registered: their data arrived only through it."""
        self.counts = {"sent": 0, "duplicates": 0, "rejected": 0, "corrupt": 0}
        self.problem = ""
        self.max_bytes = split.DEFAULT_MAX_BODY_BYTES

    def run_id(self, run: Any) -> int | None:
        """The run's id (an existing run is looked up, not re-registered: that would make a finished
        run `running` again), or None with `problem` set."""
        from contracts.wire import DEFAULT_PROJECT, encode_json

        if run.key in self.run_ids:
            return self.run_ids[run.key]
        params: dict[str, Any] = {"name": run.run_name, "limit": 2}
        if run.project is not None:
            params["project"] = run.project
        elif not self.has_token:  # registered without a project and a token: the default project
            params["project"] = DEFAULT_PROJECT
        page = self.http.get("/runs", params=params)
        found = [r["id"] for r in page.json() if r.get("name") == run.run_name] if page.is_success else []
        if len(found) == 1:
            self.run_ids[run.key] = int(found[0])
            return self.run_ids[run.key]
        registered = self.http.post("/runs", json=encode_json(run.register_body()))  # NaN as "NaN"
        if not registered.is_success:
            self.problem = (
                f"registering run {run.run_name!r}: HTTP {registered.status_code} {registered.text[:300]}"
            )
            return None
        if registered.status_code == 201:
            self.created.add(run.key)
        self.run_ids[run.key] = int(registered.json()["id"])
        return self.run_ids[run.key]

    def send(self, entry: Any) -> Any:
        """One spool entry, in parts if it is over the body limit: "ok", "retry" or "reject"."""
        import gzip

        import httpx

        from contracts import split, spool

        try:
            run_id = self.run_id(entry.run)
            if run_id is None:
                return "retry"
            pending = split.split_body(entry.kind, entry.body, self.max_bytes)
            while pending:
                body, raw = pending.pop(0)
                response = self.http.post(
                    f"/runs/{run_id}/{entry.kind}",
                    content=gzip.compress(raw),
                    headers={"content-type": "application/json", "content-encoding": "gzip"},
                )
                if response.status_code == 413:
                    limit = split.limit_from_error(response.text) or len(raw) // 2
                    self.max_bytes = min(self.max_bytes, max(1024, limit))
                    parts = split.split_body(entry.kind, body, self.max_bytes)
                    if len(parts) > 1:
                        pending[:0] = parts
                        continue
                outcome = spool.outcome_for_status(response.status_code)
                if outcome == "ok":
                    self.counts["duplicates" if response.json().get("duplicate") else "sent"] += 1
                    continue
                self.problem = f"batch {entry.batch_id}: HTTP {response.status_code} {response.text[:300]}"
                if response.status_code == 404:
                    self.run_ids.pop(entry.run.key, None)
                return outcome
        except httpx.HTTPError as exc:
            self.problem = f"{type(exc).__name__}: {exc}"
            return "retry"
        return "ok"

    def resend_rejected(self, path: Path) -> bool:
        """Offer `path/rejected/` again (older than the spool: first); False if the service is out of
        reach. Delivered batches leave `rejected/`; those refused again stay and are listed."""
        from contracts import spool

        rejected_dir = path / spool.REJECTED_DIR
        delivered, refused = 0, []
        for entry in spool.iter_entries(rejected_dir):
            outcome = self.send(entry)
            if outcome == "retry":
                return False
            if outcome == "ok":
                spool.remove(entry)
                delivered += 1
            else:
                refused.append(self.problem)
        if delivered or refused:
            console.print(
                f"{rejected_dir}: {delivered} earlier rejected batches delivered, {len(refused)} refused "
                "again and kept" + "".join(f"\n  {reason}" for reason in refused[:20])
            )
        return True

    def apply_finishes(self, path: Path) -> set[tuple[str | None, str]] | None:
        """The final status of each run with a finish marker in `path` (all its batches are
        delivered); the runs done, or None if the service could not be told."""
        import httpx

        from contracts import spool

        done: set[tuple[str | None, str]] = set()
        for marker, run, status in spool.read_finishes(path):
            try:
                run_id = self.run_id(run)
                if run_id is None:
                    return None
                response = self.http.post(f"/runs/{run_id}/finish", json={"status": status})
            except httpx.HTTPError as exc:
                self.problem = f"{type(exc).__name__}: {exc}"
                return None
            if not response.is_success:
                self.problem = f"marking run {run.run_name!r} {status}: HTTP {response.status_code} "
                self.problem += response.text[:300]
                return None
            marker.unlink(missing_ok=True)
            done.add(run.key)
            console.print(f"run {run.run_name!r} (id {run_id}): {status}")
        return done


@app.command()
def watch(
    path: Annotated[Path, typer.Argument(help="The log file to follow (it may not exist yet).")],
    run: Annotated[str, typer.Option("--run", help="Run name (get-or-create on the service).")],
    url: Annotated[str, typer.Option(envvar="LLDMON_URL", help="Base URL of the service.")] = (
        "http://127.0.0.1:8000"
    ),
    token: Annotated[
        str | None, typer.Option(envvar="LLDMON_TOKEN", help="API token, if auth is on.")
    ] = None,
    project: Annotated[
        str | None, typer.Option(envvar="LLDMON_PROJECT", help="Project (default: the service's).")
    ] = None,
    fmt: Annotated[
        Literal["auto", "verl-jsonl", "verl-console", "trl-log"],
        typer.Option("--format", help="Log format; auto: from the name and the first metrics line."),
    ] = "auto",
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Send the lines already in the file too (first watch only).")
    ] = False,
    until_idle: Annotated[
        float | None,
        typer.Option(min=0.1, help="Exit after this many seconds without a new line (default: never)."),
    ] = None,
    finish: Annotated[
        bool, typer.Option("--finish", help="With --until-idle: mark the run finished when idle.")
    ] = False,
    interval: Annotated[float, typer.Option(min=0.01, help="Seconds between checks of the file.")] = 0.5,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="Where the resume state is kept (default ~/.lldmon/watch)."),
    ] = None,
) -> None:
    """Follow a growing training log and stream each new step to the service as it is written.

    Reads verl's file logger JSONL, verl's console log and TRL's stdout. Restarting resumes where the
    last watch stopped (no step is sent twice or skipped, even after kill -9); a rotated log (renamed,
    then recreated) is finished before the new file is followed. Ctrl-C / SIGTERM finish the current
    send and exit 0. The first watch of an existing file starts at its end unless --from-start.
    """
    import signal
    import threading

    from monitor.watch import Service, Watcher, WatchError, state_file

    if finish and until_idle is None:
        console.print(
            "[red]error:[/red] --finish needs --until-idle (when else would the run be over?)", soft_wrap=True
        )
        raise typer.Exit(2)
    if path.is_dir():
        console.print(f"[red]error:[/red] {path} is a directory, not a log file", soft_wrap=True)
        raise typer.Exit(2)
    stop = threading.Event()

    def echo(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    service = Service(url, run, project, token, stop, echo)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        state = state_file(
            state_dir or Path.home() / ".lldmon" / "watch", path, service.base_url, project, run
        )
        watcher = Watcher(
            path, service, state, fmt=fmt, from_start=from_start, until_idle=until_idle, interval=interval
        )
        echo(f"watching {path} ({fmt}) into run {run!r} at {service.base_url}; state {state}")
        summary = watcher.run()
        if summary.idle and finish and service.finish():
            echo(f"run {run!r}: finished")
    except WatchError as exc:
        console.print(f"[red]error:[/red] {exc}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        service.close()
    echo(
        f"sent {summary.steps} steps in {summary.batches} batches"
        + (f" ({summary.duplicates} already there)" if summary.duplicates else "")
        + (f", {summary.refused} refused" if summary.refused else "")
        + ("; idle" if summary.idle else "; stopped")
    )


@app.command("import")
def import_logs(
    paths: Annotated[
        list[Path], typer.Argument(help="Log files of one run, in the order written (a later file wins).")
    ],
    run: Annotated[str, typer.Option("--run", help="Run name (created if missing).")],
    project: Annotated[str | None, typer.Option(help="Project (default: default).")] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="auto, verl-jsonl, verl-console, trl-log, trl-state, wandb-csv, csv, ms-swift, tensorboard "
            "or lldmon (what lldmon export writes; auto finds it for Parquet).",
        ),
    ] = "auto",
    strict: Annotated[bool, typer.Option(help="Fail on the first malformed line; write nothing.")] = False,
    append: Annotated[
        bool, typer.Option(help="Add to a run that has metrics (a stored step is overwritten).")
    ] = False,
    replace: Annotated[bool, typer.Option(help="Delete the run's metrics, phases and alerts first.")] = False,
    first_step: Annotated[
        list[int] | None,
        typer.Option(min=0, help="trl-log: step of each file's first dict (once per file)."),
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Tag the run (repeatable).")] = None,
    chunk_steps: Annotated[
        int | None, typer.Option(min=1, help="Steps per ingest batch (default 50).")
    ] = None,
    notify: Annotated[bool, typer.Option(help="Send alerts to the configured webhooks too.")] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Import trainer logs into a run; the detector runs as for a live run, phases and alerts are printed."""
    from monitor.import_command import ImportOptions, run_import

    options = ImportOptions(
        paths=paths,
        run=run,
        project=project,
        fmt=fmt,
        strict=strict,
        append=append,
        replace=replace,
        first_step=first_step or [],
        tags=tag or [],
        chunk_steps=chunk_steps,
        notify=notify,
    )
    # An old log should not page anyone: webhook and Slack sinks only with --notify.
    quiet: dict[str, Any] = {} if notify else {"webhook_urls": [], "slack_webhook_urls": []}
    code = run_import(options, console, lambda: _services(database_url, data_dir, **quiet))
    if code:
        raise typer.Exit(code)


DEFAULT_GATE = "generated,third-party"


@app.command("eval")
def evaluate_detector(
    collapse: Annotated[int, typer.Option(help="Generated collapse runs.")] = 20,
    controls: Annotated[int, typer.Option(help="Generated healthy and noisy-stagnant runs (each).")] = 10,
    seed: Annotated[int, typer.Option()] = 0,
    real_runs: Annotated[
        Path | None,
        typer.Option(
            help="Folder of real logs (shared/datasets/real_runs), scored with their labels (--labels)."
        ),
    ] = None,
    labels: Annotated[
        Path | None,
        typer.Option(
            help="Labels file (TOML) of real runs; its relative paths resolve against --real-runs, else "
            "against its own folder. Default with --real-runs: the packaged eval_labels/real_runs.toml."
        ),
    ] = None,
    lab: Annotated[
        Path | None,
        typer.Option(
            help="Folder of recorded lab runs (*.jsonl.gz; default: tests/fixtures/lab of the checkout)."
        ),
    ] = None,
    no_lab: Annotated[bool, typer.Option("--no-lab", help="Leave out the recorded lab runs.")] = False,
    per_run: Annotated[bool, typer.Option(help="Print one row per run.")] = False,
    check: Annotated[bool, typer.Option(help="Exit 1 if a target of a --gate source is missed.")] = False,
    gate: Annotated[
        str | None,
        typer.Option(
            help="Sources whose targets must be met (comma-separated: generated, lab, third-party); "
            f"exit 1 if one is missed (implies --check). Default with --check: {DEFAULT_GATE}."
        ),
    ] = None,
) -> None:
    """Run the detector over labelled runs and print the score per source (generated, lab, third-party):
    lead time, detection delay, the targets (critical finding in time, early warning, no critical
    finding on controls) and the runs that miss them."""
    from rich.markup import escape

    from monitor.detector.scenarios import scenario_suite
    from monitor.evaluation import SOURCES, LabelledRun, evaluate, labelled_runs, render
    from monitor.lab.fixtures import FixtureError, default_fixture_dir, load_fixtures
    from monitor.run_labels import DEFAULT_LABELS, LabelsError

    gate_text = gate if gate is not None else DEFAULT_GATE
    enforce = check or gate is not None
    gated = [s.strip() for s in gate_text.split(",") if s.strip()]
    unknown = [s for s in gated if s not in SOURCES]
    if unknown:
        console.print(f"[red]error:[/red] unknown source(s) {', '.join(unknown)}; use {', '.join(SOURCES)}")
        raise typer.Exit(2)
    runs = [LabelledRun.from_scenario(s) for s in scenario_suite(collapse, controls, seed)]
    lab_dir = None if no_lab else (lab if lab is not None else default_fixture_dir())
    if lab_dir is not None:
        if not lab_dir.is_dir():
            console.print(f"[red]error:[/red] {lab_dir} is not a directory")
            raise typer.Exit(2)
        try:
            recorded = load_fixtures(lab_dir)
        except FixtureError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        typer.echo(f"lab: {len(recorded)} recorded runs from {lab_dir}")
        runs += recorded
    elif not no_lab:
        typer.echo("lab: no recorded runs (not a source checkout; pass --lab DIR)")
    if real_runs is not None and not real_runs.is_dir():
        console.print(f"[red]error:[/red] {real_runs} is not a directory")
        raise typer.Exit(2)
    if labels is not None or real_runs is not None:
        labels_file = labels if labels is not None else DEFAULT_LABELS
        try:
            real = labelled_runs(labels_file, real_runs)
        except LabelsError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(2) from None
        collapsing = sum(r.collapses for r in real.runs)
        typer.echo(
            f"third-party: {len(real.runs)} labelled runs ({collapsing} collapsing) from {labels_file}"
            + (f", root {real_runs}" if real_runs is not None else "")
        )
        if real.missing:
            typer.echo(
                f"third-party: skipped {len(real.missing)} run(s) whose files are missing: "
                + ", ".join(f"{m.name} ({m.missing_files()[0]})" for m in real.missing)
            )
        runs += real.runs
    with console.status(f"evaluating {len(runs)} runs"):
        report = evaluate(runs)
    typer.echo(render(report, per_run=per_run))
    ungated = [t for t in report.missed() if t.source not in gated]
    if ungated:
        typer.echo(
            f"\nmissed, not gated (--gate {gate_text}): "
            + "; ".join(f"[{t.source}] {t.name}: {t.value}" for t in ungated)
        )
    failed = report.missed(gated)
    if failed:
        typer.echo(
            ("\nmissed, gated: " if enforce else f"\nmissed, would fail --check (--gate {gate_text}): ")
            + "; ".join(f"[{t.source}] {t.name}: {t.value}" for t in failed)
        )
    if enforce and failed:
        raise typer.Exit(1)


@app.command()
def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="SQLite, logs and training output (default: a new temp dir)."),
    ] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="A free one is used if this is taken.")] = 8000,
    steps: Annotated[int | None, typer.Option(help="GRPO steps (default 150; --quick: 6).")] = None,
    quick: Annotated[
        bool, typer.Option(help="Short run (smoke test): 6 GRPO steps after the warm-up.")
    ] = False,
    keep_serving: Annotated[
        bool, typer.Option(help="Keep the service up after the run, until Ctrl-C.")
    ] = False,
    model: Annotated[
        str, typer.Option(help="tiny (built in code), smollm2, a .gguf, a dir or HF id.")
    ] = "tiny",
    replay_seed: Annotated[int, typer.Option(help="Seed of the replayed collapse scenario.")] = 7,
    train: Annotated[bool, typer.Option(help="--no-train: only the replayed run.")] = True,
) -> None:
    """One-command demo: the service, a real TRL GRPO search agent on CPU and a replayed collapse."""
    from rich.markup import escape

    from monitor.demo import DemoError, DemoOptions, run_demo

    options = DemoOptions(
        data_dir=data_dir,
        host=host,
        port=port,
        steps=steps,
        quick=quick,
        keep_serving=keep_serving,
        model=model,
        replay_seed=replay_seed,
        train=train,
    )
    try:
        code = run_demo(options, console)
    except DemoError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    if code:
        raise typer.Exit(code)


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def main() -> None:
    """The `lldmon` entry point. Commands import their extra's packages when they run, so a command
    whose extra is not installed ends in one line naming it, not in a ModuleNotFoundError traceback."""
    try:
        app()
    except ModuleNotFoundError as exc:
        extra = _extra_providing(exc.name or "")
        if extra is None:
            raise
        from rich.markup import escape

        install = f"pip install 'lldmon[{extra}] @ <wheel, checkout or git URL>'"
        console.print(
            f"[red]error:[/red] {escape(_command_path())} needs lldmon's {extra} extra ({exc.name!r} is "
            f"not installed): {escape(install)}",
            highlight=False,
            soft_wrap=True,
        )
        raise SystemExit(1) from None


def _command_path() -> str:
    """`lldmon runs list` from sys.argv (the sub-command names only)."""
    import sys

    words = ["lldmon"]
    command: Any = typer.main.get_command(app)
    for arg in sys.argv[1:]:
        commands = getattr(command, "commands", {})  # a group (Typer's does not subclass click.Group)
        if arg not in commands:
            break
        words.append(arg)
        command = commands[arg]
    return " ".join(words)


_TEST_EXTRAS = ("verl-test", "dev")


def _extra_providing(module: str) -> str | None:
    """The first extra in lldmon's metadata that installs top-level `module` (distribution
    `prometheus-client` -> module `prometheus_client`), or None."""
    import importlib.metadata
    import re

    try:
        requirements = importlib.metadata.requires("lldmon") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    top = module.partition(".")[0].lower()
    for requirement in requirements:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if (
            name
            and extra
            and extra.group(1) not in _TEST_EXTRAS
            and re.sub(r"[-.]+", "_", name.group(1)).lower() == top
        ):
            return extra.group(1)
    return None
