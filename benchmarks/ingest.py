"""Ingest throughput: raw psycopg COPY (the ceiling) vs lldmon end to end over HTTP, side by side.

Modes, each writing the same rows (`--batch-rows` per batch: steps x `--metrics` names):

* ``copy``: psycopg 3 text COPY into ``step_metrics`` of a fresh, migrated PostgreSQL database,
  one transaction per batch, rows pre-built as tuples;
* ``lldmon-pg``: ``lldmon serve --database-url <fresh migrated database>`` in a subprocess, one
  keep-alive httpx client POSTing pre-encoded (orjson) columnar batches; only acknowledged rows count;
* ``lldmon-sqlite``: the same into the embedded SQLite (``lldmon serve --data-dir <tmp>``);
* ``mlflow``: the MLflow tracking server (``benchmarks/mlflow_ingest.py``, from the separate venv
  ``.venv-bench``) on a fresh database of the same PostgreSQL server, the same metric points through
  ``/runs/log-batch`` (1,000 per call, MLflow's limit). It is much slower, so it sends
  ``--mlflow-batches`` batches per round instead of ``--batches``; rows/s stay comparable. Skipped, with
  the reason printed and written to the JSON, when ``.venv-bench`` is missing or ``--no-mlflow`` is given.

Rounds interleave the modes (the order rotates every round) so machine noise hits them alike; the
figure of a mode is its median rows/s over the rounds. The scratch databases and servers are removed
at exit. Targets: lldmon -> PostgreSQL >= 50 % of raw COPY and >= 30x MLflow.

Usage::

    python -m benchmarks.ingest [--rounds 5] [--batches 20] [--batch-rows 5000] [--metrics 100]
                                [--mlflow-batches 4] [--mlflow-venv .venv-bench] [--no-mlflow]
                                [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
                                [--out benchmarks/results/ingest.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

try:
    from benchmarks import _util, mlflow_ingest
except ModuleNotFoundError:  # run as a script: python benchmarks/ingest.py
    import _util  # type: ignore[no-redef]
    import mlflow_ingest  # type: ignore[no-redef]

TARGET_RATIO = 0.5
TARGET_VS_MLFLOW = 30.0
MODES = ("copy", "lldmon-pg", "lldmon-sqlite", "mlflow")
LABELS = {
    "copy": "raw COPY (psycopg)",
    "lldmon-pg": "lldmon -> PostgreSQL",
    "lldmon-sqlite": "lldmon -> SQLite",
    "mlflow": "MLflow -> PostgreSQL",
}
COPY_SQL = "COPY step_metrics (run_id, name, step, value) FROM STDIN"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "ingest.json"


@dataclass(frozen=True)
class Workload:
    """Batch `k` covers steps [k * steps, (k + 1) * steps) of every metric, same values in every mode."""

    names: list[str]
    steps: int

    @property
    def rows(self) -> int:
        return len(self.names) * self.steps

    def columns(self, k: int) -> tuple[list[int], dict[str, list[float]]]:
        rng = random.Random(k)
        steps = list(range(k * self.steps, (k + 1) * self.steps))
        return steps, {name: [rng.gauss(0.0, 1.0) for _ in steps] for name in self.names}


@dataclass
class Stats:
    rows_per_s: list[float] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    rows: int = 0
    failed_batches: int = 0


Send = Callable[[Any], int]
"""Write one prepared batch; returns the rows acknowledged (0 for a failed batch)."""


class CopyMode:
    def __init__(self, url: str, workload: Workload) -> None:
        self.run_id = _util.bench_run(url, "copy")
        self.workload = workload
        self.conn = psycopg.connect(_util.libpq_conninfo(url), autocommit=True)

    def prepare(self, k: int) -> list[tuple[int, str, int, float]]:
        steps, metrics = self.workload.columns(k)
        return [
            (self.run_id, name, step, value)
            for name, values in metrics.items()
            for step, value in zip(steps, values, strict=True)
        ]

    def send(self, rows: list[tuple[int, str, int, float]]) -> int:
        with self.conn.transaction(), self.conn.cursor() as cur, cur.copy(COPY_SQL) as copy:
            for row in rows:
                copy.write_row(row)
        return len(rows)

    def close(self) -> None:
        self.conn.close()


class HttpMode:
    def __init__(self, server: _util.LldmonServer, workload: Workload, tag: str) -> None:
        self.client = httpx.Client(base_url=server.url, timeout=120.0)
        response = self.client.post("/api/v1/runs", json={"name": f"bench-{tag}-{uuid.uuid4().hex[:8]}"})
        response.raise_for_status()
        self.path = f"/api/v1/runs/{response.json()['id']}/metrics"
        self.workload = workload
        self.tag = tag

    def prepare(self, k: int) -> bytes:
        steps, metrics = self.workload.columns(k)
        return orjson.dumps(
            {"batch_id": f"{self.tag}-{k}-{uuid.uuid4().hex}", "steps": steps, "metrics": metrics}
        )

    def send(self, body: bytes) -> int:
        response = self.client.post(self.path, content=body, headers={"content-type": "application/json"})
        if response.status_code != 200:
            print(f"  ! {self.tag}: HTTP {response.status_code}: {response.text[:200]}", file=sys.stderr)
            return 0
        rows: int = orjson.loads(response.content)["rows"]
        return rows

    def close(self) -> None:
        self.client.close()


def run_block(send: Send, payloads: list[Any], stats: Stats | None) -> None:
    """Send the batches back to back; record rows/s of the block and each batch's latency."""
    latencies: list[float] = []
    rows = failed = 0
    start = time.perf_counter()
    for payload in payloads:
        t0 = time.perf_counter()
        acked = send(payload)
        latencies.append((time.perf_counter() - t0) * 1e3)
        rows += acked
        failed += acked == 0
    elapsed = time.perf_counter() - start
    if stats is not None:
        stats.rows_per_s.append(rows / elapsed)
        stats.latencies_ms.extend(latencies)
        stats.rows += rows
        stats.failed_batches += failed


def summarise(
    stats: dict[str, Stats], args: argparse.Namespace, env: dict[str, Any], mlflow: dict[str, Any]
) -> dict[str, Any]:
    copy_median = statistics.median(stats["copy"].rows_per_s)
    modes: dict[str, Any] = {}
    for mode, s in stats.items():
        median = statistics.median(s.rows_per_s)
        paired = [m / c for m, c in zip(s.rows_per_s, stats["copy"].rows_per_s, strict=True)]
        modes[mode] = {
            "rows_per_s_median": round(median),
            "rows_per_s_rounds": [round(x) for x in s.rows_per_s],
            "ratio_vs_copy": round(median / copy_median, 4),
            "ratio_vs_copy_paired_median": round(statistics.median(paired), 4),
            "latency_ms_p50": round(_util.percentile(s.latencies_ms, 50), 3),
            "latency_ms_p99": round(_util.percentile(s.latencies_ms, 99), 3),
            "rows_acknowledged": s.rows,
            "failed_batches": s.failed_batches,
        }
    ratio, paired = modes["lldmon-pg"]["ratio_vs_copy"], modes["lldmon-pg"]["ratio_vs_copy_paired_median"]
    if "mlflow" in stats:
        ml = stats["mlflow"].rows_per_s
        vs = statistics.median(stats["lldmon-pg"].rows_per_s) / statistics.median(ml)
        vs_paired = statistics.median(lp / m for lp, m in zip(stats["lldmon-pg"].rows_per_s, ml, strict=True))
        mlflow |= {
            "lldmon_pg_vs_mlflow": round(vs, 2),
            "lldmon_pg_vs_mlflow_paired_median": round(vs_paired, 2),
            "target_min": TARGET_VS_MLFLOW,
            "met": vs >= TARGET_VS_MLFLOW,
        }
    return {
        "command": _util.command_line(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": env,
        "modes": modes,
        "mlflow": mlflow,
        "target": {
            "lldmon_pg_vs_copy_min": TARGET_RATIO,
            "ratio": ratio,
            "paired_ratio": paired,
            "met": ratio >= TARGET_RATIO,
        },
    }


def print_table(result: dict[str, Any]) -> None:
    print()
    print(
        f"{'mode':<22} {'rows/s (median)':>15} {'rounds min..max':>19} {'vs COPY':>8} {'paired':>7} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'failed':>6}"
    )
    for mode, m in result["modes"].items():
        rounds = m["rows_per_s_rounds"]
        print(
            f"{LABELS[mode]:<22} {m['rows_per_s_median']:>15,} {f'{min(rounds):,}..{max(rounds):,}':>19} "
            f"{m['ratio_vs_copy']:>8.1%} {m['ratio_vs_copy_paired_median']:>7.1%} {m['latency_ms_p50']:>8.1f} {m['latency_ms_p99']:>8.1f} "
            f"{m['failed_batches']:>6}"
        )
    target = result["target"]
    verdict = "met" if target["met"] else "MISSED"
    print(
        f"\ntarget lldmon -> PostgreSQL >= {target['lldmon_pg_vs_copy_min']:.0%} of raw COPY: "
        f"{target['ratio']:.1%} ({verdict}; median of per-round ratios {target['paired_ratio']:.1%})"
    )
    mlflow = result["mlflow"]
    if "skipped" in mlflow:
        print(f"MLflow comparison skipped: {mlflow['skipped']}")
    else:
        verdict = "met" if mlflow["met"] else "MISSED"
        print(
            f"target lldmon -> PostgreSQL >= {mlflow['target_min']:.0f}x MLflow ({mlflow['version']}, log-batch, "
            f"{mlflow['workers']} worker): {mlflow['lldmon_pg_vs_mlflow']:.1f}x ({verdict}; median of per-round "
            f"ratios {mlflow['lldmon_pg_vs_mlflow_paired_median']:.1f}x); rows stored by MLflow "
            f"{mlflow['rows_stored']:,} == acknowledged {mlflow['rows_acknowledged']:,}"
        )
    print("vs COPY: ratio of the medians; paired: median over rounds of (mode / COPY in that round)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--batches", type=int, default=20, help="batches per mode per round (default 20)")
    parser.add_argument("--batch-rows", type=int, default=5000, help="rows per batch (default 5000)")
    parser.add_argument("--metrics", type=int, default=100, help="metric names per batch (default 100)")
    parser.add_argument("--warmup", type=int, default=3, help="unrecorded batches per mode first (default 3)")
    parser.add_argument(
        "--mlflow-batches", type=int, default=4, help="MLflow batches per round (default 4; it is slow)"
    )
    parser.add_argument(
        "--mlflow-venv",
        type=Path,
        default=mlflow_ingest.DEFAULT_VENV,
        help="venv with mlflow (default: %(default)s)",
    )
    parser.add_argument("--no-mlflow", action="store_true", help="leave the MLflow baseline out")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("LLDMON_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        help="any database of the PostgreSQL server; scratch databases lldmon_bench_* are made next to it",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.batch_rows % args.metrics:
        parser.error("--batch-rows must be a multiple of --metrics")
    if min(args.rounds, args.batches, args.mlflow_batches) < 1 or args.warmup < 0:
        parser.error("--rounds, --batches and --mlflow-batches must be >= 1, --warmup >= 0")
    print("command:", _util.command_line(), flush=True)

    from monitor.db.migrate import upgrade

    workload = Workload(
        [f"train/metric_{i:03d}" for i in range(args.metrics)], args.batch_rows // args.metrics
    )
    pg_version, load = _util.server_version(args.pg_url), os.getloadavg()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "postgresql": pg_version,
        "loadavg_start": load,
    }
    print(
        f"{workload.rows} rows per batch ({workload.steps} steps x {len(workload.names)} metrics), "
        f"{args.rounds} rounds x {args.batches} batches per mode; PostgreSQL {pg_version}, "
        f"{env['cpus']} CPUs, load {load[0]:.2f}",
        flush=True,
    )

    mlflow: dict[str, Any] = {}
    skip = "--no-mlflow given" if args.no_mlflow else mlflow_ingest.unavailable(args.mlflow_venv)
    if skip:
        mlflow["skipped"] = skip
        print(f"MLflow comparison skipped: {skip}", flush=True)
    active = tuple(m for m in MODES if m != "mlflow" or not skip)
    suffix = uuid.uuid4().hex[:8]
    databases = [f"lldmon_bench_copy_{suffix}", f"lldmon_bench_api_{suffix}"]
    if not skip:
        databases.append(f"lldmon_bench_mlflow_{suffix}")
    modes: dict[str, CopyMode | HttpMode | mlflow_ingest.MlflowMode] = {}
    mlflow_server: mlflow_ingest.MlflowServer | None = None
    servers: list[_util.LldmonServer] = []
    created: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="lldmon_bench_") as tmp:
            copy_url, api_url, *mlflow_url = (_util.create_database(args.pg_url, name) for name in databases)
            created = databases
            upgrade(copy_url)
            upgrade(api_url)
            for server_args, log in (
                (["--database-url", api_url], "pg.log"),
                (["--data-dir", str(Path(tmp) / "data")], "sqlite.log"),
            ):
                servers.append(_util.LldmonServer(server_args, Path(tmp) / log).__enter__())
            modes["copy"] = CopyMode(copy_url, workload)
            modes["lldmon-pg"] = HttpMode(servers[0], workload, "pg")
            modes["lldmon-sqlite"] = HttpMode(servers[1], workload, "sqlite")
            if not skip:
                mlflow_server = mlflow_ingest.MlflowServer(
                    args.mlflow_venv, mlflow_url[0], Path(tmp)
                ).__enter__()
                modes["mlflow"] = mlflow_ingest.MlflowMode(mlflow_server, workload)
                mlflow |= {"version": mlflow_ingest.version(args.mlflow_venv), "workers": 1}

            next_batch = dict.fromkeys(active, 0)

            def block(mode: str, n: int, stats: Stats | None) -> None:
                if mode == "mlflow":
                    n = min(n, args.mlflow_batches)
                first = next_batch[mode]
                next_batch[mode] += n
                payloads = [modes[mode].prepare(k) for k in range(first, first + n)]
                run_block(modes[mode].send, payloads, stats)

            for mode in active:
                block(mode, args.warmup, None)
            stats = {mode: Stats() for mode in active}
            for r in range(args.rounds):
                order = active[r % len(active) :] + active[: r % len(active)]
                for mode in order:
                    block(mode, args.batches, stats[mode])
                line = "  ".join(f"{m} {stats[m].rows_per_s[-1]:>9,.0f}" for m in active)
                print(f"round {r + 1}/{args.rounds}: rows/s  {line}", flush=True)
            env["loadavg_end"] = os.getloadavg()
            if not skip:
                mode_ml = modes["mlflow"]
                assert isinstance(mode_ml, mlflow_ingest.MlflowMode)
                mlflow["rows_stored"] = mode_ml.stored_rows(mlflow_url[0])
                warm_rows = min(args.warmup, args.mlflow_batches) * workload.rows
                mlflow["rows_acknowledged"] = stats["mlflow"].rows + warm_rows
            for server in servers:
                if server.proc is not None and server.proc.poll() is not None:
                    raise RuntimeError(f"a server died during the run:\n{server.log_tail()}")
    finally:
        for m in modes.values():
            m.close()
        for server in servers:
            server.stop()
        if mlflow_server is not None:
            mlflow_server.stop()
        for name in created:
            _util.drop_database(args.pg_url, name)

    result = summarise(stats, args, env, mlflow)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0 if all(m["failed_batches"] == 0 for m in result["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
