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
app.add_typer(db_app, name="db")
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


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def main() -> None:
    app()
