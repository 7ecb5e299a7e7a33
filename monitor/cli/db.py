"""`lldmon db`: schema migrations of the server's own database (local only: no HTTP mode)."""

from __future__ import annotations

from typing import Annotated

import typer

from monitor.cli._common import (
    DatabaseUrl,
    DataDir,
    ProjectOfRun,
    closing,
    console,
    redact,
    run_id_of,
    services,
    settings_from,
)

db_app = typer.Typer(
    help="Database schema migrations and retention (administers the server's own database: local only, "
    "no --url).",
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


@db_app.command("partition")
def db_partition(
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions",
            min=2,
            help="Hash partitions per large table (the run_id modulus); it cannot be changed in place later.",
        ),
    ] = 8,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Hash-partition the large tables (step_metrics, action_blocks, ingest_batches) by run_id
    (PostgreSQL only).

    Run it on a database at head with the service stopped: one transaction, each table locked while its
    rows move. Tables already partitioned are skipped, so run it again after an upgrade that recreates
    one. See docs/scale-out.md."""
    from monitor.db.engine import make_engine
    from monitor.db.partitioning import PartitioningError, partition_by_run

    engine = make_engine(settings_from(database_url, data_dir).resolved_database_url())
    try:
        done = partition_by_run(engine, modulus=partitions)
    except PartitioningError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    finally:
        engine.dispose()
    for table, count in done.items():
        console.print(f"{table}: {count} partitions by hash(run_id)")


@db_app.command("prune")
def db_prune(
    actions_older_than: Annotated[
        str,
        typer.Option(
            "--actions-older-than",
            help="Drop raw action records last written longer ago than this (30d, 12h, 90m); their "
            "per-step delta quantiles stay.",
        ),
    ],
    run: Annotated[
        str | None, typer.Option("--run", help="Only this run (id or name); default: all.")
    ] = None,
    project: ProjectOfRun = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be pruned; change nothing.")
    ] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Apply retention to raw action records now (a server with LLDMON_ACTIONS_RETENTION does it hourly).

    PostgreSQL reuses the freed space after (auto)vacuum; SQLite reuses it for new data (VACUUM shrinks
    the file)."""
    from monitor.config import parse_duration

    try:
        older_than = parse_duration(actions_older_than)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--actions-older-than'") from None
    state = services(database_url, data_dir)
    with closing(state):
        run_id = run_id_of(state, run, project) if run is not None else None
        result = state.retention.prune_actions(older_than, run_id, dry_run=dry_run)
    verb = "would prune" if dry_run else "pruned"
    console.print(
        f"{verb} {result.blocks} action blocks ({result.records} records) older than {actions_older_than}"
        + (f" of run {run_id}" if run_id is not None else ""),
        highlight=False,
    )
