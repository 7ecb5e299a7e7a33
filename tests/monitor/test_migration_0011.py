"""Revision 0011 (directive names) renames `directives.llds_lambda` to `llds_lam` and `created_at` to
`updated_at`, on SQLite and PostgreSQL: a directive written at 0010 reads back at 0011 with its lambda
and timestamp intact, a new version still gets its timestamp from the database, and down and up again
keep the values (read through the store at the head)."""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy import Engine, inspect, text

from monitor.db.engine import make_engine
from monitor.db.migrate import downgrade, upgrade
from monitor.db.models import UTCDateTime
from monitor.store import events as event_store

MADE = datetime(2020, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)

directives_0010 = sa.table(
    "directives",
    sa.column("run_id", sa.Integer()),
    sa.column("version", sa.Integer()),
    sa.column("llds_enabled", sa.Boolean()),
    sa.column("llds_lambda", sa.Double()),
    sa.column("reason", sa.Text()),
    sa.column("source", sa.String()),
    sa.column("step", sa.BigInteger()),
    sa.column("created_at", UTCDateTime()),
)
"""The table's columns this test writes and reads, as revision 0010 names them."""

directives_0011 = sa.table(
    "directives",
    sa.column("run_id", sa.Integer()),
    sa.column("version", sa.Integer()),
    sa.column("llds_enabled", sa.Boolean()),
    sa.column("llds_lam", sa.Double()),
    sa.column("reason", sa.Text()),
    sa.column("source", sa.String()),
    sa.column("step", sa.BigInteger()),
    sa.column("updated_at", UTCDateTime()),
)
"""The same columns as revision 0011 names them (read and written here as 0011 has them, not through
today's store, whose later columns 0011 does not have)."""


def _columns(engine: Engine) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns("directives")}


def _rows_0010(engine: Engine) -> list[tuple[int, float, datetime]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(directives_0010.c.version, directives_0010.c.llds_lambda, directives_0010.c.created_at)
            .where(directives_0010.c.run_id == 1)
            .order_by(directives_0010.c.version)
        ).all()
    return [tuple(r) for r in rows]


def test_directive_names_migration_keeps_the_values(empty_url: str) -> None:
    upgrade(empty_url, "0010")
    engine = make_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        conn.execute(
            text(
                "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                "VALUES (1, 1, 'r', '{}', 'running', 'auto')"
            )
        )
        conn.execute(
            directives_0010.insert().values(
                run_id=1,
                version=1,
                llds_enabled=True,
                llds_lambda=0.35,
                reason="manual override",
                source="manual",
                step=40,
                created_at=MADE,
            )
        )
    upgrade(empty_url, "0011")
    assert {"llds_lam", "updated_at"} <= _columns(engine)
    assert not {"llds_lambda", "created_at"} & _columns(engine)
    with engine.begin() as conn:
        [old] = conn.execute(
            sa.select(directives_0011)
            .where(directives_0011.c.run_id == 1)
            .order_by(directives_0011.c.version)
        ).all()
        assert (old.version, old.llds_enabled, old.llds_lam, old.reason, old.step, old.updated_at) == (
            1,
            True,
            0.35,
            "manual override",
            40,
            MADE,
        )
        conn.execute(
            directives_0011.insert().values(
                run_id=1,
                version=2,
                llds_enabled=True,
                llds_lam=old.llds_lam,
                reason="auto",
                source="detector",
                step=50,
            )
        )
        new = conn.execute(sa.select(directives_0011).where(directives_0011.c.version == 2)).one()
    assert new.updated_at is not None and new.updated_at > MADE  # the server default survived

    downgrade(empty_url, "0010")
    assert {"llds_lambda", "created_at"} <= _columns(engine)
    assert not {"llds_lam", "updated_at"} & _columns(engine)
    assert _rows_0010(engine) == [(1, 0.35, MADE), (2, 0.35, new.updated_at)]

    upgrade(empty_url)
    with engine.connect() as conn:
        assert [(d.version, d.llds.lam, d.updated_at) for d in event_store.directive_history(conn, 1)] == [
            (1, 0.35, MADE),
            (2, 0.35, new.updated_at),
        ]
    engine.dispose()
