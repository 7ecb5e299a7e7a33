"""`lldmon db`: schema migrations of the server's own database (local only: no HTTP mode)."""

from __future__ import annotations

from typing import Annotated

import typer

from monitor.cli._common import DatabaseUrl, DataDir, console, redact, settings_from

db_app = typer.Typer(
    help="Database schema migrations (administers the server's own database: local only, no --url).",
    no_args_is_help=True,
)


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseUrl = None, data_dir: DataDir = None, revision: str = "head") -> None:
    """Apply migrations up to REVISION (default: head)."""
    from monitor.db.engine import make_engine
    from monitor.db.migrate import upgrade

    url = settings_from(database_url, data_dir).resolved_database_url()
    make_engine(url).dispose()  # creates the SQLite data directory
    upgrade(url, revision)
    console.print(f"database at {revision}: {redact(url)}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision, e.g. base.")],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Revert migrations down to REVISION."""
    from monitor.db.migrate import downgrade

    downgrade(settings_from(database_url, data_dir).resolved_database_url(), revision)
    console.print(f"database at {revision}")


@db_app.command("current")
def db_current(database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    """Print the schema revision of the database and of the code."""
    from monitor.db.engine import make_engine
    from monitor.db.migrate import current_revision, head_revision

    engine = make_engine(settings_from(database_url, data_dir).resolved_database_url())
    console.print(f"database: {current_revision(engine) or 'empty'}  code: {head_revision()}")
    engine.dispose()
