"""Small dialect helpers shared by the store modules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Connection, FromClause, Table
from sqlalchemy.dialects import postgresql, sqlite

from monitor.db.base import Base


def table_of(model: type[Base]) -> Table:
    """The Core table of a mapped class (store code works with Core for speed and clarity)."""
    return cast(Table, model.__table__)


def insert_ignore(conn: Connection, table: Table | FromClause, row: dict[str, Any]) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING; True if the row was inserted."""
    table = cast(Table, table)
    dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    # RETURNING rather than rowcount: with implicit RETURNING, rowcount is not reliable (-1).
    statement = dialect_insert(table).values(**row).on_conflict_do_nothing()
    return conn.execute(statement.returning(*table.primary_key.columns)).first() is not None


def upsert_many(
    conn: Connection, table: str, columns: Sequence[str], keys: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """executemany INSERT ... ON CONFLICT (keys) DO UPDATE: later values win (resumed runs)."""
    if not rows:
        return
    mark = "?" if conn.dialect.name == "sqlite" else "%s"
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in keys)
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(mark for _ in columns)}) "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    )
    conn.exec_driver_sql(sql, list(rows))
