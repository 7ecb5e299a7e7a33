"""Alembic environment: online migrations only, batch mode on SQLite (ALTER TABLE is limited there)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from monitor.db import models  # noqa: F401  (registers the tables on Base.metadata)
from monitor.db.base import Base
from monitor.db.partitioning import is_partition_name

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as connection:
        _run(connection)


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # type: ignore[attr-defined]
        compare_type=True,
        # the hash partitions `lldmon db partition` creates are not models: autogenerate leaves them alone
        include_name=lambda name, kind, _parent: not (kind == "table" and is_partition_name(str(name))),
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
