"""The detector's window reads: PostgreSQL's array_agg / LATERAL path gives exactly what the generic
SQLAlchemy path gives (values, NaN stored as NULL, presence masks, step bounds, sparse metrics, chunk
ends), so the online detector sees the same history on every backend."""

from __future__ import annotations

import numpy as np
from sqlalchemy import insert

from monitor.db.engine import make_engine
from monitor.db.models import Project, Run, StepMetric
from monitor.store import detection as store


def test_window_and_chunk_end_match_the_generic_path(db_url: str) -> None:
    engine = make_engine(db_url)
    rng = np.random.default_rng(5)
    rows = []
    for name, every in (("a", 1), ("b", 3), ("c", 7), ("d", 1)):
        for step in range(0, 120, every):
            value = None if rng.random() < 0.1 else float(rng.normal())
            rows.append({"run_id": 1, "name": name, "step": step, "value": value})
    rows += [{"run_id": 2, "name": "a", "step": s, "value": 9.0} for s in range(50)]  # another run
    with engine.begin() as conn:
        conn.execute(insert(Project.__table__), [{"id": 1, "name": "p"}])
        conn.execute(
            insert(Run.__table__),
            [{"id": i, "project_id": 1, "name": f"r{i}", "config": {}, "status": "running"} for i in (1, 2)],
        )
        conn.execute(insert(StepMetric.__table__), rows)
    names = ["a", "b", "c", "missing"]
    with engine.connect() as conn:
        for lo, hi in ((None, None), (10, 60), (None, 5), (200, None), (59, 59)):
            fast = store.read_window(conn, 1, names, lo, hi)
            slow = store._read_window_generic(conn, 1, names, lo, hi)
            np.testing.assert_array_equal(fast[0], slow[0])
            assert list(fast[1]) == list(slow[1]) and list(fast[2]) == list(slow[2])
            for name in fast[1]:
                np.testing.assert_array_equal(fast[1][name], slow[1][name])  # NaN where NULL or absent
                np.testing.assert_array_equal(fast[2][name], slow[2][name])
        for after, n in ((None, 1), (None, 256), (30, 10), (115, 10), (119, 1)):
            steps = store._chunk_steps_generic(conn, 1, names, after, n + 1)
            assert store.chunk_end(conn, 1, names, after, n) == (steps[n - 1] if len(steps) > n else None)
        if conn.dialect.name == "postgresql":
            assert store._chunk_steps_postgres(conn, 1, names, 30, 5) == store._chunk_steps_generic(
                conn, 1, names, 30, 5
            )
    engine.dispose()
