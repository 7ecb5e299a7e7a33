"""Revision 0007 (action blocks) goes up, down and up again with action records in the table, on SQLite
and PostgreSQL: every record, NULL (NaN), +-inf, -0.0 and float64 values included, survives both ways in
key order, page boundaries of the conversion included; pruned blocks restore no rows."""

from __future__ import annotations

import math
from typing import Any

import pytest
from alembic import command
from sqlalchemy import inspect, text

from monitor.db.engine import make_engine
from monitor.db.migrate import alembic_config, upgrade
from monitor.store import series as series_store

KEY = ("run_id", "step", "source", "traj_index", "action_index")
COLUMNS = (*KEY, "n_tokens", "delta", "old_logp_mean", "advantage", "reward", "is_answer")
SPECIAL = [None, math.inf, -math.inf, -0.0, 0.1, 1e300, 0.5]


def old_records() -> list[tuple[Any, ...]]:
    """Two runs, several steps and both sources, a step of 7 records (larger than the small pages)."""
    rows: list[tuple[Any, ...]] = []
    for run_id, step, source, n_traj, n_act in (
        (1, 0, "loss", 3, 2),
        (1, 0, "probe", 2, 1),
        (1, 1, "loss", 1, 1),
        (1, 5, "loss", 7, 1),
        (1, 6, "probe", 2, 2),
        (1, 2**40, "loss", 1, 3),
        (2, 3, "loss", 2, 2),
    ):
        for t in range(n_traj):
            for a in range(n_act):
                i = len(rows)
                traj = 2**31 - 1 - t if step == 6 else t
                rows.append(
                    (
                        run_id,
                        step,
                        source,
                        traj,
                        a,
                        10 + i,
                        SPECIAL[i % len(SPECIAL)],
                        -1.0 - i / 8,
                        SPECIAL[(i + 3) % len(SPECIAL)],
                        float(t % 2),
                        a == n_act - 1,
                    )
                )
    return rows


def migrate(url: str, revision: str, chunk_rows: int | None, down: bool = False) -> None:
    cfg = alembic_config(url)
    if chunk_rows is not None:
        cfg.attributes["lldmon.migration_chunk_rows"] = chunk_rows
    (command.downgrade if down else command.upgrade)(cfg, revision)


def read_records(conn: Any) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        text(f"SELECT {', '.join(COLUMNS)} FROM action_records ORDER BY {', '.join(KEY)}")
    ).all()
    return [(*r[:-1], bool(r[-1])) for r in rows]


def same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Row lists equal, -0.0 told from 0.0 (repr), NULL from NaN."""
    return [tuple(map(repr, r)) for r in a] == [tuple(map(repr, r)) for r in b]


@pytest.mark.parametrize("chunk_rows", [4, None])
def test_action_blocks_migration_up_down_up_with_data(empty_url: str, chunk_rows: int | None) -> None:
    upgrade(empty_url, "0006")
    engine = make_engine(empty_url)
    records = old_records()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name) VALUES (1, 'p')"))
        for run_id in (1, 2, 3):
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, config, status, directive_policy) "
                    f"VALUES ({run_id}, 1, 'r{run_id}', '{{}}', 'running', 'alert')"
                )
            )
        conn.execute(
            text(
                f"INSERT INTO action_records ({', '.join(COLUMNS)}) "
                f"VALUES ({', '.join(':' + c for c in COLUMNS)})"
            ),
            [dict(zip(COLUMNS, r, strict=True)) for r in reversed(records)],
        )
        records = read_records(conn)  # as the old store reads them (SQLite keeps no -0.0)
    migrate(empty_url, "0007", chunk_rows)
    assert "action_records" not in inspect(engine).get_table_names()
    with engine.connect() as conn:
        blocks = conn.execute(
            text("SELECT run_id, step, source, n_records FROM action_blocks ORDER BY run_id, step, source")
        ).all()
        assert [tuple(b) for b in blocks] == [
            (1, 0, "loss", 6),
            (1, 0, "probe", 2),
            (1, 1, "loss", 1),
            (1, 5, "loss", 7),
            (1, 6, "probe", 4),
            (1, 2**40, "loss", 3),
            (2, 3, "loss", 4),
        ]
        run1 = series_store.read_actions(conn, 1, None, None, None, 1000)
        expected = [r for r in records if r[0] == 1]
        assert run1["step"] == [r[1] for r in expected]
        assert run1["source"] == [r[2] for r in expected]
        assert run1["traj_index"] == [r[3] for r in expected]
        assert run1["is_answer"] == [r[10] for r in expected]
        as_nan = [math.nan if r[6] is None else r[6] for r in expected]
        assert [repr(v) for v in run1["delta"]] == [repr(v) for v in as_nan]  # -0.0, inf, NaN kept
        assert series_store.read_actions(conn, 3, None, None, None, 1000)["step"] == []
        summaries = series_store.read_action_summaries(conn, 1, 5, 5, None)
        finite = [r[6] for r in expected if r[1] == 5 and r[6] is not None and math.isfinite(r[6])]
        assert summaries.n_all == [len(finite)]
    with engine.begin() as conn:  # retention pruned run 2's block: its records cannot come back
        conn.execute(text("UPDATE action_blocks SET payload = NULL WHERE run_id = 2"))
    migrate(empty_url, "0006", chunk_rows, down=True)
    assert "action_blocks" not in inspect(engine).get_table_names()
    with engine.connect() as conn:
        assert same(read_records(conn), [r for r in records if r[0] == 1])
    migrate(empty_url, "head", chunk_rows)
    with engine.connect() as conn:
        again = series_store.read_actions(conn, 1, None, None, None, 1000)
        assert again["traj_index"] == run1["traj_index"] and again["step"] == run1["step"]
        assert [repr(v) for v in again["delta"]] == [repr(v) for v in run1["delta"]]
        assert [repr(v) for v in again["advantage"]] == [repr(v) for v in run1["advantage"]]
    engine.dispose()


def test_downgrade_restores_the_0001_table(empty_url: str) -> None:
    """The recreated `action_records` is the table revision 0001 made (columns, key, constraints)."""
    upgrade(empty_url, "0006")
    engine = make_engine(empty_url)
    before = _shape(engine)
    upgrade(empty_url, "0007")
    migrate(empty_url, "0006", None, down=True)
    assert _shape(engine) == before
    engine.dispose()


def _shape(engine: Any) -> tuple[Any, ...]:
    insp = inspect(engine)
    columns = [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns("action_records")]
    fks = [
        (f["name"], f["referred_table"], f["options"].get("ondelete"))
        for f in insp.get_foreign_keys("action_records")
    ]
    checks = sorted(c["sqltext"] for c in insp.get_check_constraints("action_records"))
    return columns, insp.get_pk_constraint("action_records"), fks, checks
