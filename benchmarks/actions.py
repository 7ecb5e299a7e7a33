"""Action records, all variants side by side in one run: ingest, disk bytes per record, read latency.

Workload: Search-R1-shaped steps (`benchmarks._workload.search_r1_actions`): `--records` action
records per step (default 2,560), trajectories of about 4 actions, advantage and reward constant per
trajectory, float columns float32-valued as the hooks send them. A record carries 6 values
(n_tokens, delta, old_logp_mean, advantage, reward, is_answer) under its key (step, source,
traj_index, action_index); values/s = 6 x records/s in every mode.

1. Ingest, interleaved rounds (the mode order rotates every round), one step per batch as the hooks
   send it, median records/s and values/s per mode over the rounds:

   * ``api-pg``: ``lldmon serve --database-url <fresh migrated PostgreSQL database>``, POST
     /runs/{id}/actions with the real columnar JSON body (pre-encoded), one keep-alive client;
   * ``copy``: psycopg text COPY of the same records, one transaction per step, into a table with the
     old row layout (revision 0001's ``action_records`` columns, primary key and foreign key) in
     another fresh database: the ceiling of row-per-record storage;
   * ``api-sqlite``: ``lldmon serve --data-dir <tmp>`` (embedded SQLite), same bodies;
   * ``mlflow``: the MLflow tracking server (``benchmarks/mlflow_ingest.py``, venv ``.venv-bench``)
     on a fresh database of the same PostgreSQL server. A record becomes 6 metric points, one per
     value, key ``actions/<field>``, MLflow step = step x records + the record's position in the step
     (positions follow (traj_index, action_index)), so the same values land under 6 keys;
     `/runs/log-batch` takes 1,000 points per call, so a step is 16 calls. Slow: `--mlflow-steps`
     per round.

   Ratios api-pg / copy and api-pg / mlflow: of the medians, and the median of per-round ratios.
   Targets (issue 17): >= 1.0x COPY and >= 30x MLflow in values/s.
2. Disk bytes per action record after the run (VACUUM ANALYZE first): PostgreSQL
   ``pg_total_relation_size`` (heap + TOAST + indexes) of the service's action table (whatever this
   code stores: ``action_records`` rows or ``action_blocks``) and of the old-layout COPY table; SQLite
   ``dbstat`` pages of the service's action table and its indexes, and of the old row layout filled
   with `--disk-steps` steps in a scratch file. Target: <= 24 B per record in PostgreSQL.
3. Read latency (median of `--read-reps`) on a run of `--read-steps` steps (default 500) written
   through the API: one step's records over HTTP (GET /runs/{id}/actions?step_min=s&step_max=s, a
   random step each time), and the per-step delta quantiles over all `--read-steps` steps in process:
   ``QueryService.action_summaries`` (the stored per-step summaries) where the code has it, the full
   read of every record (the dashboard's ``window_actions`` without a row budget, then its per-step
   quantiles, `--slow-reps` times), and the dashboard's quantile panel as shipped (``action_figures``
   with a 500-step window; how many steps it covers is reported).

Usage::

    python -m benchmarks.actions [--quick] [--rounds 5] [--steps 8] [--records 2560] [--mlflow-steps 1]
        [--read-steps 500] [--read-reps 20] [--slow-reps 3] [--no-mlflow] [--no-sqlite]
        [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--json benchmarks/results/actions.json]
    python -m benchmarks.actions --table BEFORE.json AFTER.json   # README rows of saved results
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import psycopg

from benchmarks import _streaming, _util, mlflow_ingest
from benchmarks._workload import actions_json, search_r1_actions
from benchmarks.ingest import Stats, run_block
from contracts.wire import API_PREFIX

RECORDS = 2560
VALUE_FIELDS = ("n_tokens", "delta", "old_logp_mean", "advantage", "reward", "is_answer")
"""The values of a record; its key is (step, source, traj_index, action_index)."""
ROW_FIELDS = ("traj_index", "action_index", *VALUE_FIELDS)
MODES = ("api-pg", "copy", "api-sqlite", "mlflow")
LABELS = {
    "api-pg": "lldmon API -> PostgreSQL",
    "copy": "raw row COPY (psycopg)",
    "api-sqlite": "lldmon API -> SQLite",
    "mlflow": "MLflow -> PostgreSQL",
}
TARGET_VS_COPY = 1.0
TARGET_VS_MLFLOW = 30.0
TARGET_BYTES_PG = 24.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "actions.json"
OLD_TABLE = "action_rows_0001"
# Revision 0001's action_records, column for column (PK and FK included: they are part of its cost).
OLD_LAYOUT_PG = f"""
CREATE TABLE {OLD_TABLE} (
    run_id integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step bigint NOT NULL,
    source varchar(8) NOT NULL CHECK (source IN ('loss', 'probe')),
    traj_index integer NOT NULL,
    action_index integer NOT NULL,
    n_tokens integer NOT NULL,
    delta double precision,
    old_logp_mean double precision,
    advantage double precision,
    reward double precision,
    is_answer boolean NOT NULL,
    PRIMARY KEY (run_id, step, source, traj_index, action_index)
)"""
OLD_LAYOUT_SQLITE = f"""
CREATE TABLE {OLD_TABLE} (
    run_id INTEGER NOT NULL, step BIGINT NOT NULL, source VARCHAR(8) NOT NULL CHECK (source IN ('loss', 'probe')),
    traj_index INTEGER NOT NULL, action_index INTEGER NOT NULL, n_tokens INTEGER NOT NULL,
    delta FLOAT, old_logp_mean FLOAT, advantage FLOAT, reward FLOAT, is_answer BOOLEAN NOT NULL,
    PRIMARY KEY (run_id, step, source, traj_index, action_index)
)"""


@dataclass(frozen=True)
class StepWorkload:
    """Step k's records: the same in every mode (seeded by k)."""

    records: int

    def columns(self, k: int) -> dict[str, np.ndarray]:
        return search_r1_actions(self.records, 1_000 + k)


@dataclass(frozen=True)
class MlflowPoints:
    """The workload as MLflow metric columns (`mlflow_ingest.Columns`): key per value field, one point
    per record at MLflow step = step x records + position."""

    workload: StepWorkload

    def columns(self, k: int) -> tuple[list[int], dict[str, list[float]]]:
        n = self.workload.records
        cols = self.workload.columns(k)
        steps = list(range(k * n, (k + 1) * n))
        return steps, {f"actions/{f}": cols[f].astype(np.float64).tolist() for f in VALUE_FIELDS}


class ApiMode:
    """One run on an `lldmon serve`; step k is one action batch in the wire format the hooks send."""

    def __init__(self, base_url: str, workload: StepWorkload, tag: str) -> None:
        self.client = httpx.Client(base_url=base_url + API_PREFIX, timeout=300.0)
        response = self.client.post("/runs", json={"name": f"bench-actions-{tag}-{uuid.uuid4().hex[:8]}"})
        response.raise_for_status()
        self.run_id = int(response.json()["id"])
        self.path = f"/runs/{self.run_id}/actions"
        self.workload = workload
        self.tag = tag

    def prepare(self, k: int) -> bytes:
        n = self.workload.records
        body = {"batch_id": uuid.uuid4().hex, "step": [k] * n, **actions_json(self.workload.columns(k))}
        return orjson.dumps(body | {"source": ["loss"] * n})

    def send(self, body: bytes) -> int:
        response = self.client.post(self.path, content=body, headers={"content-type": "application/json"})
        if response.status_code != 200:
            print(f"  ! {self.tag}: HTTP {response.status_code}: {response.text[:200]}", file=sys.stderr)
            return 0
        rows: int = orjson.loads(response.content)["rows"]
        return rows

    def close(self) -> None:
        self.client.close()


class CopyMode:
    """psycopg COPY into the old row layout: the ceiling of one-row-per-record storage."""

    def __init__(self, url: str, workload: StepWorkload) -> None:
        self.run_id = _util.bench_run(url, "copy")
        self.workload = workload
        self.conn = psycopg.connect(_util.libpq_conninfo(url), autocommit=True)
        self.conn.execute(OLD_LAYOUT_PG)
        self.sql = f"COPY {OLD_TABLE} (run_id, step, source, {', '.join(ROW_FIELDS)}) FROM STDIN"

    def prepare(self, k: int) -> list[tuple[Any, ...]]:
        return old_rows(self.run_id, k, self.workload.columns(k))

    def send(self, rows: list[tuple[Any, ...]]) -> int:
        with self.conn.transaction(), self.conn.cursor() as cur, cur.copy(self.sql) as copy:
            for row in rows:
                copy.write_row(row)
        return len(rows)

    def close(self) -> None:
        self.conn.close()


def old_rows(run_id: int, step: int, cols: dict[str, np.ndarray]) -> list[tuple[Any, ...]]:
    n = len(cols["traj_index"])
    return list(
        zip([run_id] * n, [step] * n, ["loss"] * n, *(cols[f].tolist() for f in ROW_FIELDS), strict=True)
    )


# --- disk -----------------------------------------------------------------------------------------


def service_table(conninfo: str) -> str:
    """The table this code stores action records in (the migrated schema tells)."""
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT to_regclass('action_blocks') IS NOT NULL").fetchone()
    return "action_blocks" if row and row[0] else "action_records"


def count_sql(table: str) -> str:
    if table == "action_blocks":
        return "SELECT coalesce(sum(n_records), 0), count(*) FROM action_blocks"
    return f"SELECT count(*), count(*) FROM {table}"


def pg_disk(conninfo: str, table: str) -> dict[str, Any]:
    """Bytes of `table` (heap, TOAST, indexes) after VACUUM ANALYZE, per record."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {table}")
        total, heap, indexes = conn.execute(
            "SELECT pg_total_relation_size(%s), pg_relation_size(%s), pg_indexes_size(%s)",
            (table, table, table),
        ).fetchone() or (0, 0, 0)
        records, rows = conn.execute(count_sql(table)).fetchone() or (0, 0)
    return _disk(table, int(records), int(rows), int(total), heap=int(heap), indexes=int(indexes))


def sqlite_disk(path: Path, table: str) -> dict[str, Any]:
    """Pages (dbstat) of `table` and its indexes in the SQLite file, per record."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        present = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'action_blocks'").fetchone()
        if table == "service":
            table = "action_blocks" if present and present[0] else "action_records"
        total, *_ = conn.execute(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_master WHERE tbl_name = ?)",
            (table,),
        ).fetchone()
        records, rows = conn.execute(count_sql(table)).fetchone()
    return _disk(table, int(records), int(rows), int(total))


def _disk(table: str, records: int, rows: int, total: int, **parts: int) -> dict[str, Any]:
    out: dict[str, Any] = {"table": table, "records": records, "rows": rows, "bytes": total}
    if parts:
        out["heap"], out["indexes"] = parts["heap"], parts["indexes"]
        out["toast_and_maps"] = total - parts["heap"] - parts["indexes"]
    out["bytes_per_record"] = round(total / records, 2) if records else None
    return out


def sqlite_old_layout(path: Path, workload: StepWorkload, steps: int) -> dict[str, Any]:
    """The old row layout in a scratch SQLite file, `steps` steps inserted as the old store did."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(OLD_LAYOUT_SQLITE)
        marks = ", ".join("?" * (3 + len(ROW_FIELDS)))
        for k in range(steps):
            conn.executemany(f"INSERT INTO {OLD_TABLE} VALUES ({marks})", old_rows(1, k, workload.columns(k)))
        conn.commit()
    return sqlite_disk(path, OLD_TABLE)


# --- reads ----------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], reps: int) -> tuple[dict[str, Any], Any]:
    """Median / p90 ms of `reps` calls after one warm-up call; the last result."""
    result = fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    stats = {
        "n": reps,
        "median_ms": round(statistics.median(samples), 2),
        "p90_ms": round(_util.percentile(samples, 90), 2),
    }
    return stats, result


def read_latency(
    base_url: str, settings: Any, run_id: int, steps: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One step over HTTP; quantiles over `steps` steps in process (summaries, full read, dashboard)."""
    from dashboard.figures import delta_quantiles
    from monitor.api.app import build_state
    from monitor.domain import Principal

    out: dict[str, Any] = {"steps": steps}
    rng = np.random.default_rng(7)
    with httpx.Client(base_url=base_url + API_PREFIX, timeout=120.0) as client:

        def one_step() -> int:
            s = int(rng.integers(0, steps))
            response = client.get(f"/runs/{run_id}/actions", params={"step_min": s, "step_max": s})
            response.raise_for_status()
            return len(orjson.loads(response.content)["step"])

        out["one_step_http"], n = timed(one_step, args.read_reps)
        out["one_step_http"]["records"] = n
        summary_route = client.get(
            f"/runs/{run_id}/actions/summary", params={"step_min": 0, "step_max": steps - 1}
        )
        if summary_route.status_code == 200:

            def summary_http() -> int:
                r = client.get(
                    f"/runs/{run_id}/actions/summary", params={"step_min": 0, "step_max": steps - 1}
                )
                r.raise_for_status()
                return len(r.content)

            out["summaries_http"], size = timed(summary_http, args.read_reps)
            out["summaries_http"]["bytes"] = size

    state = build_state(settings)
    principal = Principal()
    hi = steps - 1
    try:
        if hasattr(state.query, "action_summaries"):

            def summaries() -> int:
                return len(state.query.action_summaries(principal, run_id, 0, hi, None).steps)

            out["summaries"], n = timed(summaries, args.read_reps)
            out["summaries"]["steps_covered"] = n

        def full_read() -> int:
            columns = read_all(state, principal, run_id, hi, steps * args.records)
            figure = delta_quantiles(columns)
            return len(figure["data"][0]["x"]) if figure["data"] else 0

        out["full_read_quantiles"], n = timed(full_read, args.slow_reps)
        out["full_read_quantiles"]["steps_covered"] = n
        action_figures = dashboard_function("action_figures")
        if action_figures is not None:

            def panel() -> int:
                _, quantiles = action_figures(state, principal, run_id, hi, steps, "all")
                return len(quantiles["data"][0]["x"]) if quantiles["data"] else 0

            out["dashboard_panel"], n = timed(panel, args.slow_reps)
            out["dashboard_panel"]["steps_covered"] = n
    finally:
        state.db.dispose()
    return out


def dashboard_function(name: str) -> Callable[..., Any] | None:
    """`dashboard.callbacks.actions.<name>` where this version of the code has it."""
    fn = getattr(importlib.import_module("dashboard.callbacks.actions"), name, None)
    return fn if callable(fn) else None


def read_all(state: Any, principal: Any, run_id: int, hi: int, budget: int) -> dict[str, list[Any]]:
    """Every record of steps 0..hi: the dashboard's chunked window read without its row budget."""
    window_actions = dashboard_function("window_actions")  # row storage's reader (before #17)
    if window_actions is not None:
        columns: dict[str, list[Any]] = window_actions(state, principal, run_id, 0, hi, None, budget + 1)[0]
        return columns
    columns = {}
    for lo in range(0, hi + 1, 25):  # the same chunks, through the query layer
        part = state.query.actions(principal, run_id, lo, min(hi, lo + 24), None, 200_000)
        for name, values in part.items():
            columns.setdefault(name, []).extend(values)
    return columns


# --- the run --------------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch(pg_url: str, tag: str, migrate: bool = True) -> Iterator[str]:
    if migrate:
        with _streaming.scratch_database(pg_url, tag) as url:
            yield url
        return
    name = f"lldmon_bench_{tag}_{uuid.uuid4().hex[:8]}"
    url = _util.create_database(pg_url, name)
    try:
        yield url
    finally:
        _util.drop_database(pg_url, name)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    workload = StepWorkload(args.records)
    env: dict[str, Any] = _streaming.machine() | {"postgresql": _util.server_version(args.pg_url)}
    env["loadavg_start"] = env.pop("loadavg")
    mlflow: dict[str, Any] = {}
    skip = "--no-mlflow given" if args.no_mlflow else mlflow_ingest.unavailable(args.mlflow_venv)
    if skip:
        mlflow["skipped"] = skip
        print(f"MLflow comparison skipped: {skip}", flush=True)
    active = tuple(
        m for m in MODES if not (m == "mlflow" and skip) and not (m == "api-sqlite" and args.no_sqlite)
    )
    result: dict[str, Any] = {"command": _util.command_line(), "environment": env}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lldmon_bench_actions_")))
        api_url = stack.enter_context(scratch(args.pg_url, "actions_api"))
        copy_url = stack.enter_context(scratch(args.pg_url, "actions_copy"))
        table = service_table(_util.libpq_conninfo(api_url))
        env["storage"] = table
        print(f"service storage: {table}; load {env['loadavg_start']}", flush=True)
        pg = stack.enter_context(_util.LldmonServer(["--database-url", api_url], tmp / "pg.log"))
        modes: dict[str, Any] = {
            "api-pg": ApiMode(pg.url, workload, "pg"),
            "copy": CopyMode(copy_url, workload),
        }
        sqlite_server = None
        if "api-sqlite" in active:
            sqlite_server = stack.enter_context(
                _util.LldmonServer(["--data-dir", str(tmp / "data")], tmp / "sqlite.log")
            )
            modes["api-sqlite"] = ApiMode(sqlite_server.url, workload, "sqlite")
        if "mlflow" in active:
            mlflow_url = stack.enter_context(scratch(args.pg_url, "actions_mlflow", migrate=False))
            server = stack.enter_context(mlflow_ingest.MlflowServer(args.mlflow_venv, mlflow_url, tmp))
            modes["mlflow"] = mlflow_ingest.MlflowMode(server, MlflowPoints(workload))
            mlflow |= {"version": mlflow_ingest.version(args.mlflow_venv), "workers": 1}
        for mode in modes.values():
            stack.callback(mode.close)

        next_step = dict.fromkeys(active, 0)

        def block(mode: str, n: int, stats: Stats | None) -> None:
            first = next_step[mode]
            next_step[mode] += n
            payloads = [modes[mode].prepare(k) for k in range(first, first + n)]
            send = modes[mode].send
            if mode == "mlflow":  # it acknowledges points: 6 per record

                def send(calls: Any, send_points: Callable[[Any], int] = send) -> int:
                    return send_points(calls) // len(VALUE_FIELDS)

            run_block(send, payloads, stats)

        for mode in active:
            block(mode, min(args.warmup, args.mlflow_steps) if mode == "mlflow" else args.warmup, None)
        stats = {mode: Stats() for mode in active}
        for r in range(args.rounds):
            order = active[r % len(active) :] + active[: r % len(active)]
            for mode in order:
                block(mode, args.mlflow_steps if mode == "mlflow" else args.steps, stats[mode])
            line = "  ".join(f"{m} {stats[m].rows_per_s[-1]:>9,.0f}" for m in active)
            print(f"round {r + 1}/{args.rounds}: records/s  {line}   load {load()}", flush=True)
        env["loadavg_after_ingest"] = load()
        result["ingest"] = summarise_ingest(stats, args, mlflow)
        if "mlflow" in active:
            mode_ml = modes["mlflow"]
            mlflow["points_stored"] = mode_ml.stored_rows(mlflow_url)
            warm = min(args.warmup, args.mlflow_steps) * args.records
            mlflow["points_acknowledged"] = (stats["mlflow"].rows + warm) * len(VALUE_FIELDS)

        # Reads: a run of --read-steps steps per service, written through the API.
        reads: dict[str, Any] = {}
        read_targets = [("postgresql", pg.url, _settings(database_url=api_url))]
        if sqlite_server is not None:
            read_targets.append(("sqlite", sqlite_server.url, _settings(data_dir=tmp / "data")))
        for backend, url, settings in read_targets:
            mode_r = ApiMode(url, workload, f"read-{backend}")
            stack.callback(mode_r.close)
            t0 = time.perf_counter()
            seed_stats = Stats()
            run_block(mode_r.send, [mode_r.prepare(k) for k in range(args.read_steps)], seed_stats)
            print(
                f"{backend}: seeded {args.read_steps} steps ({seed_stats.rows:,} records) in "
                f"{time.perf_counter() - t0:.1f} s; load {load()}",
                flush=True,
            )
            reads[backend] = read_latency(url, settings, mode_r.run_id, args.read_steps, args)
            reads[backend]["seed_records_per_s"] = round(seed_stats.rows_per_s[0])
            reads[backend]["loadavg"] = load()
            print(f"{backend} reads: {json.dumps(reads[backend])}", flush=True)
        result["read"] = reads

        disk: dict[str, Any] = {
            "postgresql": {
                "service": pg_disk(_util.libpq_conninfo(api_url), table),
                "old_row_layout_copy": pg_disk(_util.libpq_conninfo(copy_url), OLD_TABLE),
            }
        }
        for server_ in (pg, sqlite_server):
            if server_ is not None and server_.proc is not None and server_.proc.poll() is not None:
                raise RuntimeError(f"a server died during the run:\n{server_.log_tail()}")
        if sqlite_server is not None:
            sqlite_server.stop()
            disk["sqlite"] = {
                "service": sqlite_disk(tmp / "data" / "lldmon.db", "service"),
                "old_row_layout": sqlite_old_layout(tmp / "old_layout.db", workload, args.disk_steps),
            }
        result["disk"] = disk
    env["loadavg_end"] = load()
    result["mlflow"] = mlflow
    result["workload"] = {
        "records_per_step": args.records,
        "trajectories_per_step": int(workload.columns(0)["traj_index"][-1]) + 1,
        "values_per_record": len(VALUE_FIELDS),
        "value_fields": list(VALUE_FIELDS),
    }
    result["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result["targets"] = targets(result)
    return result


def _settings(**kwargs: Any) -> Any:
    from monitor.config import Settings

    return Settings(**kwargs)


def summarise_ingest(
    stats: dict[str, Stats], args: argparse.Namespace, mlflow: dict[str, Any]
) -> dict[str, Any]:
    values = len(VALUE_FIELDS)
    modes: dict[str, Any] = {}
    for mode, s in stats.items():
        median = statistics.median(s.rows_per_s)
        modes[mode] = {
            "records_per_s_median": round(median),
            "values_per_s_median": round(median * values),
            "records_per_s_rounds": [round(x) for x in s.rows_per_s],
            "step_latency_ms_p50": round(_util.percentile(s.latencies_ms, 50), 1),
            "step_latency_ms_p99": round(_util.percentile(s.latencies_ms, 99), 1),
            "records_acknowledged": s.rows,
            "failed_batches": s.failed_batches,
        }
    api = stats["api-pg"].rows_per_s
    ratios: dict[str, Any] = {}
    for other in ("copy", "mlflow", "api-sqlite"):
        if other in stats:
            theirs = stats[other].rows_per_s
            ratios[f"api-pg/{other}"] = round(statistics.median(api) / statistics.median(theirs), 3)
            ratios[f"api-pg/{other} paired"] = round(
                statistics.median(a / b for a, b in zip(api, theirs, strict=True)), 3
            )
    return {"modes": modes, "ratios": ratios}


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    ratios = result["ingest"]["ratios"]
    out = [
        {
            "name": "API ingest / raw row COPY (values/s)",
            "value": ratios["api-pg/copy"],
            "min": TARGET_VS_COPY,
        },
    ]
    if "api-pg/mlflow" in ratios:
        out.append(
            {
                "name": "API ingest / MLflow (values/s)",
                "value": ratios["api-pg/mlflow"],
                "min": TARGET_VS_MLFLOW,
            }
        )
    per_record = result["disk"]["postgresql"]["service"]["bytes_per_record"]
    out.append({"name": "PostgreSQL bytes per action record", "value": per_record, "max": TARGET_BYTES_PG})
    for t in out:
        v = t["value"]
        t["met"] = v is not None and (v >= t["min"] if "min" in t else v <= t["max"])
    return out


# --- report ---------------------------------------------------------------------------------------


def print_report(result: dict[str, Any]) -> None:
    env, ing = result["environment"], result["ingest"]
    print(
        f"\nstorage: {env['storage']}; {result['workload']['records_per_step']} records per step, "
        f"{result['workload']['values_per_record']} values per record"
    )
    print(
        f"{'mode':<27} {'records/s':>11} {'values/s':>12} {'rounds min..max':>21} {'p50 ms':>8} {'p99 ms':>8} {'failed':>6}"
    )
    for mode, m in ing["modes"].items():
        rounds = m["records_per_s_rounds"]
        print(
            f"{LABELS[mode]:<27} {m['records_per_s_median']:>11,} {m['values_per_s_median']:>12,} "
            f"{f'{min(rounds):,}..{max(rounds):,}':>21} {m['step_latency_ms_p50']:>8.1f} "
            f"{m['step_latency_ms_p99']:>8.1f} {m['failed_batches']:>6}"
        )
    print(
        "ratios (of medians; paired = median of per-round ratios): "
        + ", ".join(f"{k} {v:.3g}x" for k, v in ing["ratios"].items())
    )
    if "skipped" in result["mlflow"]:
        print(f"MLflow skipped: {result['mlflow']['skipped']}")
    for backend, parts in result["disk"].items():
        for name, d in parts.items():
            extra = (
                f" (heap {d['heap']:,}, indexes {d['indexes']:,}, TOAST+maps {d['toast_and_maps']:,})"
                if "heap" in d
                else ""
            )
            print(
                f"disk {backend:<10} {name:<20} {d['table']:<17} {d['records']:>10,} records in {d['rows']:>9,} rows: "
                f"{d['bytes']:>12,} B = {d['bytes_per_record']} B/record{extra}"
            )
    for backend, r in result["read"].items():
        parts = [
            f"{k} {v['median_ms']} ms (p90 {v['p90_ms']})"
            + (f", {v['steps_covered']} steps" if "steps_covered" in v else "")
            for k, v in r.items()
            if isinstance(v, dict)
        ]
        print(f"read {backend} ({r['steps']} steps): " + "; ".join(parts))
    for t in result["targets"]:
        bound = f">= {t['min']}" if "min" in t else f"<= {t['max']}"
        print(f"target {t['name']} {bound}: {t['value']} -> {'met' if t['met'] else 'MISSED'}")
    print(
        f"load average: start {env['loadavg_start']}, after ingest {env['loadavg_after_ingest']}, end {env['loadavg_end']}"
    )
    print("\nREADME rows (measurement | storage | figure | command | load avg start/end):")
    for line in readme_rows(result):
        print(line)


def readme_rows(result: dict[str, Any]) -> list[str]:
    env, ing, disk = result["environment"], result["ingest"], result["disk"]
    storage, cmd = env["storage"], f"`{_short_command(result['command'])}`"
    load_ = f"{env['loadavg_start'][0]} / {env['loadavg_end'][0]}"
    rows = []
    for mode, m in ing["modes"].items():
        rows.append(
            (
                f"ingest {LABELS[mode]}",
                f"{m['values_per_s_median']:,} values/s ({m['records_per_s_median']:,} records/s)",
            )
        )
    for k, v in ing["ratios"].items():
        if "paired" not in k:
            rows.append((f"ingest ratio {k}", f"{v:.3g}x (paired {ing['ratios'][k + ' paired']:.3g}x)"))
    for backend, parts in disk.items():
        for name, d in parts.items():
            rows.append((f"disk {backend} {name} ({d['table']})", f"{d['bytes_per_record']} B/record"))
    for backend, r in result["read"].items():
        for k, v in r.items():
            if isinstance(v, dict):
                covered = f", {v['steps_covered']} steps" if "steps_covered" in v else ""
                rows.append(
                    (f"read {backend} {k} ({r['steps']}-step run)", f"{v['median_ms']} ms median{covered}")
                )
    return [f"| {what} | {storage} | {figure} | {cmd} | {load_} |" for what, figure in rows]


def _short_command(command: str) -> str:
    """`python -m benchmarks.actions ...` without the interpreter's full path."""
    _, _, tail = command.partition(" -m ")
    return f"python -m {tail}" if tail else command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="minimal sizes: a smoke test, not a measurement")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--steps", type=int, default=8, help="steps per mode per round (default 8)")
    parser.add_argument("--records", type=int, default=RECORDS, help="action records per step (default 2560)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded steps per mode first (default 1)")
    parser.add_argument(
        "--mlflow-steps", type=int, default=1, help="MLflow steps per round (default 1; it is slow)"
    )
    parser.add_argument(
        "--mlflow-venv", type=Path, default=mlflow_ingest.DEFAULT_VENV, help="venv with mlflow"
    )
    parser.add_argument("--no-mlflow", action="store_true", help="leave the MLflow baseline out")
    parser.add_argument("--no-sqlite", action="store_true", help="leave SQLite out (ingest, disk, reads)")
    parser.add_argument("--read-steps", type=int, default=500, help="steps of the read run (default 500)")
    parser.add_argument("--read-reps", type=int, default=20, help="timed calls per fast read (default 20)")
    parser.add_argument("--slow-reps", type=int, default=3, help="timed calls of the full reads (default 3)")
    parser.add_argument(
        "--disk-steps", type=int, default=50, help="steps of the SQLite old-layout file (default 50)"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("LLDMON_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT, help="JSON results (default: %(default)s)")
    parser.add_argument(
        "--table",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="print the README rows of saved results (e.g. before and after a change) and exit",
    )
    args = parser.parse_args(argv)
    if args.table:
        print("| measurement | storage | figure | command | load avg start / end |\n|---|---|---|---|---|")
        for path in args.table:
            print("\n".join(readme_rows(json.loads(path.read_text()))))
        return 0
    if args.quick:
        args.rounds, args.steps, args.records, args.mlflow_steps = 1, 2, 256, 1
        args.read_steps, args.read_reps, args.slow_reps, args.disk_steps = 20, 2, 1, 4
    if (
        min(
            args.rounds,
            args.steps,
            args.records,
            args.mlflow_steps,
            args.read_steps,
            args.read_reps,
            args.slow_reps,
        )
        < 1
    ):
        parser.error("sizes must be >= 1")
    print("command:", _util.command_line(), flush=True)
    result = run(args)
    print_report(result)
    _streaming.write_json(args.json, result)
    failed = sum(m["failed_batches"] for m in result["ingest"]["modes"].values())
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
