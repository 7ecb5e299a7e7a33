"""Reading back what a live server stored, and waiting until a client has delivered everything."""

from __future__ import annotations

import sqlite3
import time

from contracts import spool
from tests.live_server import LiveServer
from trainer_hooks.client import MonitorClient


def ledger_batches(server: LiveServer, run_id: int) -> dict[str, int]:
    """batch id -> rows of the run's metrics batch ledger (SQLite server); asserts that no
    (metric, step) has two rows."""
    db = sqlite3.connect(f"file:{server.data_dir / 'lldmon.db'}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT batch_id, n_rows FROM ingest_batches WHERE run_id = ? AND kind = 'metrics'", (run_id,)
        ).fetchall()
        dupes = db.execute(
            "SELECT name, step, count(*) FROM step_metrics WHERE run_id = ? GROUP BY name, step HAVING count(*) > 1",
            (run_id,),
        ).fetchall()
    finally:
        db.close()
    assert dupes == [], f"points stored twice: {dupes[:5]}"
    return {str(b): int(n) for b, n in rows}


def wait_until_delivered(client: MonitorClient, timeout: float) -> None:
    """flush() also returns for spooled records: wait until the spool is replayed as well."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.flush(timeout=5) and spool.spool_size(client.spool_dir) == (0, 0):
            return
        time.sleep(0.05)
    raise AssertionError(f"not delivered after {timeout}s: spool {spool.spool_size(client.spool_dir)}")
