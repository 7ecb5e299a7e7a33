"""`lldmon token` and `lldmon auth`: who may use the API. They administer the server itself, so they work
on its database only (no --url): a token cannot mint tokens."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from monitor.cli._common import AsJson, DatabaseUrl, DataDir, console, print_json, quoted, services, shown
from monitor.text import printable

token_app = typer.Typer(
    help="API tokens (auth is on once one was created). Local only: administers the server's database.",
    no_args_is_help=True,
)


@token_app.command("create")
def token_create(
    project: Annotated[str, typer.Option(help="Project the token may read and write.")],
    name: Annotated[str, typer.Option(help="A label for the token.")] = "",
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Mint a token. It is printed once and stored only as a hash."""
    state = services(database_url, data_dir)
    try:
        token, token_id = state.auth.create_token(project, name)
    finally:
        state.db.dispose()
    console.print(f"token {token_id} for project {quoted(project)} (shown once):", style="bold")
    typer.echo(token)


@token_app.command("list")
def token_list(as_json: AsJson = False, database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    """The tokens (never their secret: a prefix to recognise them)."""
    state = services(database_url, data_dir)
    try:
        tokens = state.auth.list_tokens()
    finally:
        state.db.dispose()
    if as_json:
        print_json(
            [
                {
                    "id": t.id,
                    "project": t.project,
                    "name": t.name,
                    "prefix": t.prefix,
                    "created_at": t.created_at.isoformat(),
                    "revoked_at": None if t.revoked_at is None else t.revoked_at.isoformat(),
                }
                for t in tokens
            ]
        )
        return
    table = Table("id", "project", "name", "prefix", "created", "revoked")
    for t in tokens:
        table.add_row(
            str(t.id),
            shown(t.project),
            shown(t.name),
            shown(t.prefix) + "…",
            str(t.created_at),
            str(t.revoked_at or ""),
        )
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: int, database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    from monitor.errors import NotFound

    state = services(database_url, data_dir)
    try:
        state.auth.revoke(token_id)
        status = state.auth.status()
    except NotFound as exc:
        console.print(f"[red]error:[/red] {shown(exc.message)}")
        raise typer.Exit(1) from None
    finally:
        state.db.dispose()
    typer.echo(f"token {token_id} revoked")
    if not status.active:  # the last one: say that the API is now locked, not open
        typer.echo(status.describe())


auth_app = typer.Typer(
    help="Whether the API needs tokens; switching auth off again. Local only: administers the server's "
    "database.",
    no_args_is_help=True,
)


@auth_app.command("status")
def auth_status(database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    """Say whether auth is on and why."""
    state = services(database_url, data_dir)
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

    state = services(database_url, data_dir)
    try:
        status = state.auth.status()
        if not status.enabled:
            typer.echo("auth is already off: no token exists")
            return
        if not (yes or status.active):  # with an active token turn_off refuses: nothing to confirm
            typer.confirm("Open the API to anyone who can reach it?", abort=True)
        deleted = state.auth.turn_off()
    except Conflict as exc:
        typer.echo(f"error: {printable(exc.message)}", err=True)
        raise typer.Exit(2) from None
    finally:
        state.db.dispose()
    typer.echo(f"auth is off: deleted {deleted} revoked token(s); the API is open to anyone who can reach it")
