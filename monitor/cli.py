"""`lldmon` command line: serve, db, token, runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="lldmon: collapse diagnostics for GRPO agent training.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema migrations.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens (auth is on once one exists).", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect runs.", no_args_is_help=True)
alerts_app = typer.Typer(help="List and acknowledge alerts.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(alerts_app, name="alerts")
app.add_typer(token_app, name="token")
app.add_typer(runs_app, name="runs")

console = Console()

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
    return Settings(**values)


@app.command()
def serve(
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
    host: Annotated[str | None, typer.Option(envvar="LLDMON_HOST")] = None,
    port: Annotated[int | None, typer.Option(envvar="LLDMON_PORT")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes (PostgreSQL only).")] = 1,
) -> None:
    """Run the API (upgrades an empty or outdated embedded SQLite first)."""
    import uvicorn

    from monitor.api.app import SchemaOutdated, create_app

    settings = _settings(database_url, data_dir, host=host, port=port)
    try:
        application = create_app(settings)
    except SchemaOutdated as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    url = f"http://{settings.host}:{settings.port}"
    console.print(f"lldmon serving on [bold]{url}[/bold]  (API docs: {url}/docs)")
    console.print(f"database: {_redact(settings.resolved_database_url())}")
    if workers > 1:
        if settings.is_sqlite:
            console.print("[red]error:[/red] --workers > 1 needs PostgreSQL (SQLite allows one writer)")
            raise typer.Exit(2)
        application.state.lldmon.db.dispose()
        # Worker processes build their settings from the environment (monitor.api.factory).
        os.environ["LLDMON_DATABASE_URL"] = settings.resolved_database_url()
        uvicorn.run(
            "monitor.api.factory:app", factory=True, host=settings.host, port=settings.port, workers=workers
        )
        return
    uvicorn.run(application, host=settings.host, port=settings.port, log_level=settings.log_level)


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


def _services(database_url: str | None, data_dir: Path | None) -> Any:
    from monitor.api.app import SchemaOutdated, build_state

    try:
        return build_state(_settings(database_url, data_dir))
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
    except NotFound as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    console.print(f"token {token_id} revoked")


@runs_app.command("list")
def runs_list(
    project: Annotated[str | None, typer.Option()] = None,
    status: Annotated[str | None, typer.Option()] = None,
    tag: Annotated[str | None, typer.Option()] = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    from monitor.domain import Principal, RunFilter

    state = _services(database_url, data_dir)
    table = Table("id", "project", "name", "status", "phase", "last step", "last seen", "tags")
    for r in state.runs.list(Principal(), RunFilter(project=project, status=status, tag=tag)):
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


def _run_id(state: Any, ref: str) -> int:
    """A run given by id, or by name when that name is unique across projects."""
    from monitor.domain import Principal, RunFilter

    if ref.isdigit():
        return int(ref)
    matches = [r for r in state.runs.list(Principal(), RunFilter(limit=1000)) if r.name == ref]
    if len(matches) != 1:
        console.print(f"[red]error:[/red] {len(matches)} runs are named {ref!r}; use the run id")
        raise typer.Exit(1)
    return int(matches[0].id)


@alerts_app.command("list")
def alerts_list(
    run: Annotated[str, typer.Argument(help="Run id or unique name.")],
    status: Annotated[str | None, typer.Option(help="open, acknowledged or resolved.")] = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    from monitor.domain import Principal

    state = _services(database_url, data_dir)
    table = Table("id", "severity", "kind", "status", "steps", "message")
    for a in state.alerts.list(Principal(), _run_id(state, run), status):
        table.add_row(str(a.id), a.severity, a.kind, a.status, f"{a.first_step}-{a.last_step}", a.message)
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
    from monitor.errors import NotFound

    state = _services(database_url, data_dir)
    try:
        alert = state.alerts.acknowledge(Principal(), _run_id(state, run), alert_id)
    except NotFound as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    console.print(f"alert {alert.id} ({alert.kind}) {alert.status}")


@app.command()
def directive(
    run: Annotated[str, typer.Argument(help="Run id or unique name.")],
    llds: Annotated[str | None, typer.Option("--llds", help="on or off.")] = None,
    lam: Annotated[float | None, typer.Option("--lambda", help="LLDS weight (paper: 0.2).")] = None,
    policy: Annotated[str | None, typer.Option(help="off, alert or auto.")] = None,
    reason: Annotated[str, typer.Option(help="Recorded with the change.")] = "",
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Show or override what the trainer is told (e.g. `--llds on --lambda 0.3`) and the run's policy."""
    from monitor.domain import Principal
    from monitor.errors import LLDMonError

    state = _services(database_url, data_dir)
    run_id = _run_id(state, run)
    try:
        if policy is not None:
            state.runs.set_policy(Principal(), run_id, policy)
        if llds is not None or lam is not None:
            current = state.query.directive(Principal(), run_id)
            if llds not in (None, "on", "off"):
                raise typer.BadParameter("--llds must be on or off")
            enabled = current.llds_enabled if llds is None else llds == "on"
            state.query.set_directive(
                Principal(),
                run_id,
                llds_enabled=enabled,
                llds_lambda=current.llds_lambda if lam is None else lam,
                reason=reason,
            )
        current = state.query.directive(Principal(), run_id)
        run_info = state.runs.get(Principal(), run_id)
    except LLDMonError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    console.print(
        f"run {run_id}: policy {run_info.directive_policy}; directive v{current.version}: "
        f"LLDS {'on' if current.llds_enabled else 'off'}, lambda {current.llds_lambda} "
        f"({current.source}: {current.reason})"
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
    Stops at the first batch that cannot be delivered now; exit code 1 if any are left.
    """
    import gzip

    import httpx

    from contracts import spool
    from contracts.wire import API_PREFIX

    if not directory.is_dir():
        console.print(f"[red]error:[/red] {directory} is not a directory")
        raise typer.Exit(2)
    dirs = spool.find_spool_dirs(directory)
    run_ids: dict[tuple[str | None, str], int] = {}
    counts = {"sent": 0, "duplicates": 0, "rejected": 0, "corrupt": 0}
    problem: list[str] = []
    headers = {"authorization": f"Bearer {token}"} if token else {}

    with httpx.Client(base_url=url.rstrip("/") + API_PREFIX, headers=headers, timeout=timeout) as http:

        def run_id_of(run: spool.RunIdentity) -> int | str:
            """The run's id (an existing run is looked up, not re-registered), or an error text."""
            if run.key in run_ids:
                return run_ids[run.key]
            if run.project is not None:
                offset = 0
                while True:
                    page = http.get("/runs", params={"project": run.project, "limit": 1000, "offset": offset})
                    if not page.is_success:
                        break
                    found = [r["id"] for r in page.json() if r.get("name") == run.run_name]
                    if found:
                        run_ids[run.key] = int(found[0])
                        return run_ids[run.key]
                    if len(page.json()) < 1000:
                        break
                    offset += 1000
            registered = http.post("/runs", json=run.register_body())
            if not registered.is_success:
                return (
                    f"registering run {run.run_name!r}: HTTP {registered.status_code} {registered.text[:300]}"
                )
            run_ids[run.key] = int(registered.json()["id"])
            return run_ids[run.key]

        def send(entry: spool.SpoolEntry) -> spool.Outcome:
            try:
                run_id = run_id_of(entry.run)
                if isinstance(run_id, str):
                    problem[:] = [run_id]
                    return "retry"
                response = http.post(
                    f"/runs/{run_id}/{entry.kind}",
                    content=gzip.compress(entry.body_bytes()),
                    headers={"content-type": "application/json", "content-encoding": "gzip"},
                )
            except httpx.HTTPError as exc:
                problem[:] = [f"{type(exc).__name__}: {exc}"]
                return "retry"
            outcome = spool.outcome_for_status(response.status_code)
            if outcome == "ok":
                counts["duplicates" if response.json().get("duplicate") else "sent"] += 1
                return outcome
            problem[:] = [f"batch {entry.batch_id}: HTTP {response.status_code} {response.text[:300]}"]
            if response.status_code == 404:
                run_ids.pop(entry.run.key, None)
            return outcome

        for path in dirs:
            report = spool.replay(path, send)
            counts["rejected"] += report.rejected
            counts["corrupt"] += report.corrupt
            if report.rejected:
                console.print(f"{report.rejected} rejected batches kept in {path / spool.REJECTED_DIR}")
            if report.stopped:
                break
    remaining = sum(spool.spool_size(path)[0] for path in dirs)
    console.print(
        f"sent {counts['sent']}, duplicates {counts['duplicates']}, rejected {counts['rejected']}, "
        f"remaining {remaining}" + (f", corrupt {counts['corrupt']}" if counts["corrupt"] else "")
    )
    if remaining:
        console.print(f"[yellow]stopped:[/yellow] {problem[0] if problem else 'not delivered'}")
        raise typer.Exit(1)


@app.command("eval")
def evaluate_detector(
    collapse: Annotated[int, typer.Option(help="Generated collapse runs.")] = 20,
    controls: Annotated[int, typer.Option(help="Generated healthy and noisy-stagnant runs (each).")] = 10,
    seed: Annotated[int, typer.Option()] = 0,
    real_runs: Annotated[
        Path | None, typer.Option(help="Folder of real logs used as controls (shared/datasets/real_runs).")
    ] = None,
    per_run: Annotated[bool, typer.Option(help="Print one row per run.")] = False,
    check: Annotated[bool, typer.Option(help="Exit 1 if a target is missed.")] = False,
) -> None:
    """Run the detector over labelled runs: lead time, detection delay, false alarms, targets."""
    from monitor.detector.scenarios import scenario_suite
    from monitor.evaluation import LabelledRun, evaluate, render
    from monitor.evaluation import real_runs as load_real_runs

    runs = [LabelledRun.from_scenario(s) for s in scenario_suite(collapse, controls, seed)]
    if real_runs is not None:
        if not real_runs.is_dir():
            console.print(f"[red]error:[/red] {real_runs} is not a directory")
            raise typer.Exit(2)
        runs += load_real_runs(real_runs)
    with console.status(f"evaluating {len(runs)} runs"):
        report = evaluate(runs)
    typer.echo(render(report, per_run=per_run))
    if check and not report.all_met:
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
    app()
