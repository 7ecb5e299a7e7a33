"""Shared parts of the streaming benchmarks (concurrent_runs, scale): scratch databases, run
registration, async senders, Prometheus scrapes, CPU accounting and the database-side correctness checks.

The checks read the scratch database directly with psycopg: the benchmark verifies the service from
outside, so it must not go through the service's own query layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import _util
from benchmarks._workload import SimRun
from contracts.wire import API_PREFIX, decode_float


@contextlib.contextmanager
def scratch_database(pg_url: str, tag: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database `lldmon_bench_<tag>_<random>`, dropped on exit."""
    from monitor.db.migrate import upgrade

    name = f"lldmon_bench_{tag}_{uuid.uuid4().hex[:8]}"
    url = _util.create_database(pg_url, name)
    try:
        upgrade(url)
        yield url
    finally:
        _util.drop_database(pg_url, name)


def register_runs(base_url: str, runs: list[SimRun], project: str) -> dict[str, int]:
    """POST /runs for every simulated run; returns name -> run id."""
    ids: dict[str, int] = {}
    with httpx.Client(base_url=base_url + API_PREFIX, timeout=30.0) as client:
        for run in runs:
            response = client.post("/runs", json={"name": run.name, "project": project})
            response.raise_for_status()
            ids[run.name] = int(response.json()["id"])
    return ids


@dataclass
class Sent:
    """What the client had acknowledged: rows per kind, batch latencies, failures."""

    metric_rows: int = 0
    action_rows: int = 0
    metric_batches: int = 0
    action_batches: int = 0
    failures: list[str] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)
    latency_ms: dict[str, list[float]] = field(
        default_factory=lambda: {"metrics": [], "actions": [], "combined": []}
    )


async def post_batch(
    client: httpx.AsyncClient, path: str, body: bytes, kind: str, sent: Sent, attempts: int = 4
) -> bool:
    """POST one batch (`kind` "combined": a metrics and an actions batch, `/combined`) as the real
    client does: a transport error (connection dropped before the
    answer) is retried with the same body, hence the same `batch_id`, so a batch committed before
    the drop is acknowledged as a duplicate and counted once. Records the successful attempt's latency
    and every retry."""
    for attempt in range(attempts):
        t0 = time.perf_counter()
        try:
            response = await client.post(path, content=body, headers={"content-type": "application/json"})
        except httpx.TransportError as exc:
            sent.retries.append(f"{kind} {path}: {type(exc).__name__} {exc}".strip())
            if attempt == attempts - 1:
                sent.failures.append(f"{kind} {path}: {type(exc).__name__} after {attempts} attempts")
                return False
            await asyncio.sleep(0.5 * (attempt + 1))
            continue
        sent.latency_ms[kind].append((time.perf_counter() - t0) * 1e3)
        if response.status_code != 200:
            sent.failures.append(f"{kind} {path}: HTTP {response.status_code}: {response.text[:200]}")
            return False
        answer = response.json()
        acks = answer.items() if kind == "combined" else [(kind, answer)]
        for half, ack in acks:
            if ack["duplicate"] and attempt == 0:
                sent.failures.append(f"{half} {path}: duplicate acknowledgement of a new batch")
                return False
            if half == "metrics":
                sent.metric_rows += ack["rows"]
                sent.metric_batches += 1
            else:
                sent.action_rows += ack["rows"]
                sent.action_batches += 1
        return True
    return False


def async_client(base_url: str, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=base_url + API_PREFIX, timeout=300.0, limits=limits)


# --- Prometheus -----------------------------------------------------------------------------------


def scrape(base_url: str) -> dict[str, float]:
    """GET /metrics as a flat {"name{label=value,...}": value} dict of every sample."""
    text = httpx.get(base_url + "/metrics", timeout=30.0).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def histogram_delta(
    before: dict[str, float], after: dict[str, float], name: str, label: str = ""
) -> dict[str, Any]:
    """Count, mean and bucket-estimated p50/p99 (upper bucket bounds) of a histogram between two scrapes."""

    def get(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    sep = "," if label else ""
    count = get(f"{name}_count{{{label}}}")
    total = get(f"{name}_sum{{{label}}}")
    buckets: list[tuple[float, float]] = []
    prefix = f"{name}_bucket{{"
    for key in after:
        if key.startswith(prefix) and (not label or key[len(prefix) :].startswith(label + sep)):
            le = key[len(prefix) :].rstrip("}").split("le=")[-1]
            buckets.append((float(le), get(key)))
    buckets.sort()

    def quantile(q: float) -> float | None:
        for bound, cumulative in buckets:
            if count and cumulative >= q * count:
                return bound
        return None

    return {
        "count": int(count),
        "mean_ms": round(1e3 * total / count, 3) if count else None,
        "p50_le_ms": _ms(quantile(0.5)),
        "p99_le_ms": _ms(quantile(0.99)),
    }


def _ms(seconds: float | None) -> float | None:
    if seconds is None:
        return None
    return seconds * 1e3 if math.isfinite(seconds) else math.inf


# --- CPU accounting -------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, children it waited for included) of `pid`; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


def tree_pids(pid: int) -> list[int]:
    """`pid` and its descendants (uvicorn workers, the mlflow server's workers)."""
    pids = [pid]
    for p in pids:
        with contextlib.suppress(OSError), open(f"/proc/{p}/task/{p}/children") as f:
            pids.extend(int(x) for x in f.read().split())
    return pids


def backend_pids(db_url: str, application_name: str | None = None) -> list[int]:
    """PostgreSQL backend processes connected to the database of `db_url` (only those of one engine,
    told apart by its connections' `application_name`, when given)."""
    conninfo = _util.libpq_conninfo(db_url)
    query = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    with psycopg.connect(conninfo) as conn:
        if application_name is None:
            rows = conn.execute(query).fetchall()
        else:
            rows = conn.execute(query + " AND application_name = %s", (application_name,)).fetchall()
    return [int(r[0]) for r in rows]


class CpuMeter:
    """CPU seconds spent by labelled process groups between `start()` and `stop()`.

    PostgreSQL backends come and go (the pool closes overflow connections when they are returned), so
    `poll()` is called about once a second and the last value seen of every process counts: a
    backend that exited between two polls loses at most its last second. A process that appeared after
    `start()` counts from zero.
    """

    def __init__(self, server_pids: list[int], db_url: str) -> None:
        self.server_pids = server_pids
        self.db_url = db_url
        self.start_values: dict[str, dict[int, float]] = {}
        self.last_seen: dict[str, dict[int, float]] = {"server": {}, "postgres": {}}
        self.client0 = 0.0

    def _sample(self) -> dict[str, dict[int, float]]:
        servers = {p: process_cpu(p) for root in self.server_pids for p in tree_pids(root)}
        backends = {p: process_cpu(p) for p in backend_pids(self.db_url)}
        return {"server": servers, "postgres": backends}

    def start(self) -> None:
        self.start_values = self._sample()
        self.last_seen = {group: dict(values) for group, values in self.start_values.items()}
        self.client0 = time.process_time()

    def poll(self) -> None:
        for group, values in self._sample().items():
            for pid, cpu in values.items():
                if cpu > 0:  # 0: the process ended between listing and reading it
                    self.last_seen[group][pid] = cpu

    def stop(self) -> dict[str, float]:
        self.poll()
        out = {
            group: round(sum(v - self.start_values[group].get(p, 0.0) for p, v in values.items()), 2)
            for group, values in self.last_seen.items()
        }
        out["client"] = round(time.process_time() - self.client0, 2)
        return out


# --- database checks ------------------------------------------------------------------------------


ACTION_COUNTS = {
    # Per-step blocks (revision 0007): a block's n_records is its record count (kept after pruning).
    "action_blocks": "SELECT r.name, b.step, sum(b.n_records) FROM action_blocks b "
    "JOIN runs r ON r.id = b.run_id GROUP BY r.name, b.step",
    # One row per record (revisions 0001-0006).
    "action_records": "SELECT r.name, a.step, count(*) FROM action_records a JOIN runs r ON r.id = a.run_id "
    "GROUP BY r.name, a.step",
}


def action_table(conn: psycopg.Connection[Any]) -> str:
    """Where this schema keeps action records: `action_blocks`, or the older `action_records` rows."""
    row = conn.execute("SELECT to_regclass('action_blocks') IS NOT NULL").fetchone()
    return "action_blocks" if row and row[0] else "action_records"


def check_last_blocks(conn: psycopg.Connection[Any], runs: list[SimRun]) -> tuple[int, int]:
    """(blocks decoded, blocks whose columns differ from what was sent): the newest block of each run,
    decoded with the service's codec (a block's bytes are opaque to SQL)."""
    from monitor.store.action_codec import ACTION_FIELDS, decode_block

    rows = conn.execute(
        "SELECT DISTINCT ON (r.name) r.name, b.payload FROM action_blocks b JOIN runs r ON r.id = b.run_id "
        "WHERE b.payload IS NOT NULL ORDER BY r.name, b.step DESC, b.source"
    ).fetchall()
    by_name = {r.name: r for r in runs}
    wrong = 0
    for name, payload in rows:
        sent = orjson.loads(b"{" + by_name[str(name)].actions_tail[1:])  # the step's columns as sent
        block = decode_block(bytes(payload))
        for field_ in ACTION_FIELDS:
            got, want = np.asarray(getattr(block, field_)), np.asarray(sent[field_])
            if not np.array_equal(got, want, equal_nan=got.dtype.kind == "f"):
                wrong += 1
                break
    return len(rows), wrong


def check_database(
    db_url: str, runs: list[SimRun], steps: dict[str, range], action_steps: dict[str, range], sent: Sent
) -> dict[str, Any]:
    """Compare the database with what was sent: every (run, metric, step) of `steps` exactly once with
    the sent value, `actions` records per step of `action_steps`, one ledger entry per acknowledged batch."""
    conninfo = _util.libpq_conninfo(db_url)
    with psycopg.connect(conninfo) as conn:
        metric_rows = conn.execute(
            "SELECT r.name, m.name, m.step, m.value FROM step_metrics m JOIN runs r ON r.id = m.run_id"
        ).fetchall()
        table = action_table(conn)
        action_counts = conn.execute(ACTION_COUNTS[table]).fetchall()
        blocks_checked, blocks_wrong = check_last_blocks(conn, runs) if table == "action_blocks" else (0, 0)
        ledger = conn.execute("SELECT kind, count(*) FROM ingest_batches GROUP BY kind").fetchall()
    stored: dict[tuple[str, str, int], float | None] = {}
    duplicated = 0
    for run_name, name, step, value in metric_rows:
        key = (run_name, name, int(step))
        duplicated += key in stored
        stored[key] = value
    expected: dict[tuple[str, str, int], float] = {}
    by_name = {r.name: r for r in runs}
    for run_name, rng in steps.items():
        for name, column in by_name[run_name].values.items():
            for step in rng:
                raw = column[step]
                if raw is not None:
                    expected[(run_name, name, step)] = decode_float(raw)
    lost = [k for k in expected if k not in stored]
    extra = [k for k in stored if k not in expected]
    wrong = [k for k, v in expected.items() if k in stored and not _same(v, stored[k])]
    actions = {(str(n), int(s)): int(c) for n, s, c in action_counts}
    expected_actions = {
        (n, s): by_name[n].actions for n, rng in action_steps.items() for s in rng if by_name[n].actions
    }
    action_mismatch = [
        k for k in set(actions) | set(expected_actions) if actions.get(k) != expected_actions.get(k)
    ]
    ledger_counts = {str(k): int(c) for k, c in ledger}
    return {
        "metric_rows_expected": len(expected),
        "metric_rows_stored": len(stored),
        "metric_rows_acknowledged": sent.metric_rows,
        "metric_rows_lost": len(lost),
        "metric_rows_unexpected": len(extra),
        "metric_rows_duplicated": duplicated,
        "metric_values_wrong": len(wrong),
        "action_rows_expected": sum(expected_actions.values()),
        "action_rows_stored": sum(actions.values()),
        "action_rows_acknowledged": sent.action_rows,
        "action_steps_mismatched": len(action_mismatch),
        "action_blocks_decoded": blocks_checked,
        "action_blocks_wrong": blocks_wrong,
        "ledger_batches": ledger_counts,
        "batches_acknowledged": {"metrics": sent.metric_batches, "actions": sent.action_batches},
        "retries": len(sent.retries),
        "ok": not (lost or extra or wrong or duplicated or action_mismatch or blocks_wrong)
        and len(stored) == sent.metric_rows
        and sum(actions.values()) == sent.action_rows
        and ledger_counts.get("metrics", 0) == sent.metric_batches
        and ledger_counts.get("actions", 0) == sent.action_batches
        and not sent.failures,
        "examples": {
            "lost": lost[:3],
            "unexpected": extra[:3],
            "wrong": wrong[:3],
            "actions": action_mismatch[:3],
        },
    }


def _same(a: float, b: float | None) -> bool:
    if b is None:  # a NULL value is NaN in the database
        return math.isnan(a)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def phase_events(db_url: str) -> dict[str, list[tuple[str, int]]]:
    """Run name -> [(phase, step), ...] in step order."""
    with psycopg.connect(_util.libpq_conninfo(db_url)) as conn:
        rows = conn.execute(
            "SELECT r.name, e.phase, e.step FROM phase_events e JOIN runs r ON r.id = e.run_id ORDER BY r.name, e.step, e.id"
        ).fetchall()
    out: dict[str, list[tuple[str, int]]] = {}
    for name, phase, step in rows:
        out.setdefault(str(name), []).append((str(phase), int(step)))
    return out


def alert_count(db_url: str) -> int:
    with psycopg.connect(_util.libpq_conninfo(db_url)) as conn:
        row = conn.execute("SELECT count(*) FROM alerts").fetchone()
    return int(row[0]) if row else 0


def machine() -> dict[str, Any]:
    """CPU count, model and load average: every figure is quoted with the machine it ran on."""
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpus": os.cpu_count(), "cpu_model": model, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def write_json(path: Path, result: dict[str, Any]) -> None:
    """A benchmark's summary as JSON (for run_all), and where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")
