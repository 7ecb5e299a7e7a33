"""Scale-out on PostgreSQL: hash-partition the tables that grow with the data by `run_id`.

Every read and write of the service on these tables names one run (retention over all runs is the
one periodic exception), so with `PARTITION BY HASH (run_id)` the
planner touches one partition, vacuum and index builds work per partition, and the same key is the
distribution column of a distributed PostgreSQL (Citus `create_distributed_table(t, 'run_id')`).
The partitioned table keeps the original's name, columns, defaults, primary key, check and foreign
keys and indexes (same names), so the application, the Alembic models comparison and later
migrations see the same schema. See docs/scale-out.md for when and how to use it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

PARTITION_KEY = "run_id"

LARGE_TABLES: tuple[str, ...] = ("step_metrics", "action_blocks", "ingest_batches")
"""Tables whose size grows per step (metrics, action blocks, the per-batch ledger); keyed by run first."""

PER_RUN_SMALL_TABLES: tuple[str, ...] = ("run_tags", "phase_events", "alerts", "directives", "rollbacks")
"""Tables with a run_id that grow per event, not per step: left unpartitioned (a few rows per run)."""


_PARTITION_NAME = re.compile(rf"^(?:{'|'.join(map(re.escape, LARGE_TABLES))})_p[0-9]+$")


def is_partition_name(name: str) -> bool:
    """Whether `name` is one of the partitions `partition_by_run` creates (`<large table>_p<i>`): they
    are storage, not tables of the model, so Alembic's comparison must skip them."""
    return _PARTITION_NAME.match(name) is not None


class PartitioningError(RuntimeError):
    """The database or a table cannot be partitioned as asked; nothing was changed."""


@dataclass(frozen=True)
class _TableSpec:
    name: str
    stored_columns: tuple[str, ...]  # every column but generated ones: what the row copy moves
    constraints: tuple[tuple[str, str, str], ...]  # (name, contype, definition) but CHECK (LIKE copies)
    indexes: tuple[tuple[str, str], ...]  # (name, CREATE INDEX statement) not backing a constraint
    owned_sequences: tuple[tuple[str, str], ...]  # (sequence, column) owned by a column (serial)


def partition_by_run(
    engine: Engine, modulus: int = 8, tables: Sequence[str] = LARGE_TABLES
) -> dict[str, int]:
    """Convert `tables` into tables `PARTITION BY HASH (run_id)` with `modulus` partitions each,
    named `<table>_p<i>`, moving existing rows, all in one transaction (all tables or none).

    Tables already hash-partitioned by run_id are left as they are (idempotent). Returns each
    table's number of partitions. Raises `PartitioningError` on another database than PostgreSQL, a
    missing table, a primary key not starting with run_id, or a feature this copy does not carry
    over (identity columns, triggers, foreign keys pointing at the table); nothing changes then.
    Take the service down first: the conversion holds an exclusive lock on each table.
    """
    if engine.dialect.name != "postgresql":
        raise PartitioningError(
            f"hash partitioning by run_id needs PostgreSQL; this database is {engine.dialect.name}"
        )
    if isinstance(modulus, bool) or not isinstance(modulus, int) or modulus < 1:
        raise PartitioningError(f"modulus must be a positive integer, not {modulus!r}")
    result: dict[str, int] = {}
    with engine.begin() as conn:
        to_convert: list[_TableSpec] = []
        for table in dict.fromkeys(tables):
            existing = _existing_partitions(conn, table)
            if existing is not None:
                result[table] = existing
                continue
            to_convert.append(_inspect_table(conn, table))
        for spec in to_convert:
            _convert(conn, spec, modulus)
            result[spec.name] = modulus
    return result


def partition_layout(conn: Connection) -> dict[str, list[str]]:
    """Partitioned tables of the current schema and their partitions (sorted); {} when none."""
    rows = conn.execute(
        text(
            "SELECT p.relname, c.relname FROM pg_partitioned_table pt "
            "JOIN pg_class p ON p.oid = pt.partrelid "
            "LEFT JOIN pg_inherits i ON i.inhparent = pt.partrelid "
            "LEFT JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE p.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
            "ORDER BY 1, 2"
        )
    ).all()
    layout: dict[str, list[str]] = {}
    for parent, child in rows:
        layout.setdefault(parent, [])
        if child is not None:
            layout[parent].append(child)
    return layout


def _quote(conn: Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote(name)


def _oid(conn: Connection, table: str) -> int:
    oid = conn.execute(text("SELECT to_regclass(:t)::oid"), {"t": _quote(conn, table)}).scalar()
    if oid is None:
        raise PartitioningError(f"table {table!r} does not exist (is the database migrated to head?)")
    return int(oid)


def _existing_partitions(conn: Connection, table: str) -> int | None:
    """Partition count if `table` is already hash-partitioned by run_id, None if it is a plain table."""
    oid = _oid(conn, table)
    row = conn.execute(
        text(
            "SELECT pg_get_partkeydef(pt.partrelid), "
            "(SELECT count(*) FROM pg_inherits i WHERE i.inhparent = pt.partrelid) "
            "FROM pg_partitioned_table pt WHERE pt.partrelid = :oid"
        ),
        {"oid": oid},
    ).first()
    if row is None:
        return None
    key, partitions = row
    if key != f"HASH ({PARTITION_KEY})":
        raise PartitioningError(f"{table} is already partitioned, by {key}, not by HASH ({PARTITION_KEY})")
    return int(partitions)


def _inspect_table(conn: Connection, table: str) -> _TableSpec:
    """Read everything the copy must carry over from the catalog, refusing what it cannot."""
    oid = _oid(conn, table)
    params = {"oid": oid}
    pk = conn.execute(
        text(
            "SELECT a.attname FROM pg_constraint c "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1] "
            "WHERE c.conrelid = :oid AND c.contype = 'p'"
        ),
        params,
    ).scalar()
    if pk != PARTITION_KEY:
        raise PartitioningError(
            f"{table}: its primary key must start with {PARTITION_KEY} to be partitioned by it "
            f"(it starts with {pk!r})"
        )
    stored_columns: list[str] = []
    for name, identity, generated in conn.execute(
        text(
            "SELECT attname, attidentity, attgenerated FROM pg_attribute "
            "WHERE attrelid = :oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ),
        params,
    ).all():
        if identity:
            raise PartitioningError(f"{table}.{name} is an identity column; it is not carried over")
        if not generated:
            stored_columns.append(name)
    constraints: list[tuple[str, str, str]] = []
    for name, contype, definition, no_inherit in conn.execute(
        text(
            "SELECT conname, contype, pg_get_constraintdef(oid), connoinherit FROM pg_constraint "
            "WHERE conrelid = :oid AND contype IN ('p', 'u', 'x', 'c', 'f') "
            "ORDER BY strpos('puxcf', contype::text), conname"
        ),
        params,
    ).all():
        if no_inherit and contype == "c":
            raise PartitioningError(f"{table}: a NO INHERIT constraint ({name}) cannot be partitioned")
        if contype != "c":
            constraints.append((name, contype, definition))
    indexes = tuple(
        (name, definition)
        for name, definition in conn.execute(
            text(
                "SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = :oid AND NOT EXISTS "
                "(SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid AND c.conrelid = :oid) "
                "ORDER BY i.relname"
            ),
            params,
        ).all()
    )
    not_by_run = conn.execute(
        text(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attname = :key "
            "WHERE x.indrelid = :oid AND x.indisunique AND NOT a.attnum = ANY (x.indkey::int2[])"
        ),
        {**params, "key": PARTITION_KEY},
    ).scalars()
    for unique in not_by_run:
        raise PartitioningError(
            f"{table}: unique index {unique} lacks {PARTITION_KEY}; a partition cannot enforce it"
        )
    triggers = conn.execute(
        text("SELECT tgname FROM pg_trigger WHERE tgrelid = :oid AND NOT tgisinternal"), params
    ).scalars()
    for trigger in triggers:
        raise PartitioningError(f"{table}: trigger {trigger} is not carried over; drop it first")
    referencing = conn.execute(
        text(
            "SELECT conrelid::regclass::text || '.' || conname FROM pg_constraint "
            "WHERE confrelid = :oid AND contype = 'f'"
        ),
        params,
    ).scalars()
    for fk in referencing:
        raise PartitioningError(f"{table}: foreign key {fk} points at it; it is not carried over")
    owned = tuple(
        (str(seq), str(col))
        for seq, col in conn.execute(
            text(
                "SELECT s.oid::regclass::text, a.attname FROM pg_depend d "
                "JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' "
                "JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid "
                "WHERE d.refobjid = :oid AND d.classid = 'pg_class'::regclass AND d.deptype = 'a'"
            ),
            params,
        ).all()
    )
    return _TableSpec(table, tuple(stored_columns), tuple(constraints), indexes, owned)


def _convert(conn: Connection, spec: _TableSpec, modulus: int) -> None:
    """Rename the table (and its index names) out of the way, create the partitioned one under the
    original names, move the rows, then build constraints and indexes once over the moved rows."""
    q = _quote(conn, spec.name)
    old = _quote(conn, f"{spec.name[:40]}__unpartitioned")
    run = conn.exec_driver_sql
    run(f"LOCK TABLE {q} IN ACCESS EXCLUSIVE MODE")
    run(f"ALTER TABLE {q} RENAME TO {old}")
    # Index names are schema-wide: free the constraint-backed and plain index names for the new table.
    for k, (name, contype, _) in enumerate(spec.constraints):
        if contype in ("p", "u", "x"):
            run(f"ALTER TABLE {old} RENAME CONSTRAINT {_quote(conn, name)} TO {_quote(conn, f'_old_c{k}')}")
    for k, (name, _) in enumerate(spec.indexes):
        run(f"ALTER INDEX {_quote(conn, name)} RENAME TO {_quote(conn, f'_old_i{k}')}")
    # LIKE copies columns, NOT NULL, defaults and CHECK constraints as stored (same names, same
    # expression trees: re-parsing their text would not give back identical definitions).
    run(
        f"CREATE TABLE {q} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED "
        f"INCLUDING COMMENTS INCLUDING STORAGE INCLUDING COMPRESSION) "
        f"PARTITION BY HASH ({_quote(conn, PARTITION_KEY)})"
    )
    for i in range(modulus):
        run(
            f"CREATE TABLE {_quote(conn, f'{spec.name}_p{i}')} PARTITION OF {q} "
            f"FOR VALUES WITH (MODULUS {modulus}, REMAINDER {i})"
        )
    stored = ", ".join(_quote(conn, c) for c in spec.stored_columns)
    run(f"INSERT INTO {q} ({stored}) SELECT {stored} FROM {old}")
    for name, _, definition in spec.constraints:
        run(f"ALTER TABLE {q} ADD CONSTRAINT {_quote(conn, name)} {definition}")
    for _, create_index in spec.indexes:
        run(create_index)  # captured before the rename, so it names the new table
    for sequence, column in spec.owned_sequences:
        run(f"ALTER SEQUENCE {sequence} OWNED BY {q}.{_quote(conn, column)}")
    run(f"DROP TABLE {old}")
    run(f"ANALYZE {q}")
