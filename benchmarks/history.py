"""Run history on a 10,000-step run with 30 metrics (300,000 points): `runs show`, `export`, pandas.

A real AppState on a temporary embedded SQLite holds the run (the dashboard benchmark's synthetic
run, with NaN, +inf and -inf sprinkled in), written through the store in 250-step batches. Timed,
median of `--reps` after one warm-up:

* ``runs_show``        QueryService.summary + the rich rendering + the --json document
* ``export_csv``       ExportService.write, CSV, all metrics (temp file, fsync, rename)
* ``export_parquet``   the same as Parquet
* ``fetch_metrics``    trainer_hooks.history.fetch_metrics over HTTP from a live `lldmon serve`
                       (default page size: 2 requests), decoded into a DataFrame

Usage::

    python -m benchmarks.history [--steps 10000] [--reps 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks import _util
from benchmarks.dashboard import synthetic_run
from monitor.api.app import build_state
from monitor.config import Settings
from monitor.domain import MetricsColumns, Principal
from monitor.run_report import render_summary, summary_json
from monitor.services.export import ExportService
from monitor.store import ingest as ingest_store
from monitor.store import runs as run_store

OPEN = Principal()
BATCH_STEPS = 250


def seed(state: Any, n_steps: int) -> tuple[int, int]:
    values = synthetic_run(n_steps)
    rng = np.random.default_rng(3)
    for col in values.values():
        idx = rng.choice(n_steps, 30, replace=False)
        col[idx[:10]], col[idx[10:20]], col[idx[20:]] = np.nan, np.inf, -np.inf
    run, _ = state.runs.register(OPEN, "big-grpo", "bench", {}, [])
    for lo in range(0, n_steps, BATCH_STEPS):
        hi = min(n_steps, lo + BATCH_STEPS)
        steps = list(range(lo, hi)) * len(values)
        names = [name for name in values for _ in range(hi - lo)]
        vals = [None if np.isnan(v) else float(v) for col in values.values() for v in col[lo:hi]]
        with state.db.write() as conn:
            ingest_store.write_metrics(conn, run.id, MetricsColumns(steps, names, vals))
            run_store.touch_run(conn, run.id, hi - 1)
    return run.id, len(values)


def timed(fn: Callable[[], Any], reps: int) -> float:
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the timings here")
    args = parser.parse_args(argv)
    print("command:", _util.command_line(), flush=True)
    from tests.live_server import LiveServer
    from trainer_hooks.history import fetch_metrics

    with tempfile.TemporaryDirectory(prefix="lldmon-bench-history-") as tmp:
        data = Path(tmp) / "data"
        state = build_state(Settings(data_dir=data))
        run_id, n_metrics = seed(state, args.steps)
        exporter = ExportService(state.query)

        def show() -> None:
            summary = state.query.summary(OPEN, run_id)
            render_summary(summary, Console(file=io.StringIO(), width=160))
            summary_json(summary)

        results = {"runs_show": timed(show, args.reps)}
        for fmt in ("csv", "parquet"):
            out = Path(tmp) / f"export.{fmt}"
            results[f"export_{fmt}"] = timed(partial(exporter.write, OPEN, run_id, fmt, out), args.reps)
            results[f"{fmt}_mib"] = out.stat().st_size / 2**20
        state.db.dispose()
        with LiveServer(Path(tmp) / "data").start() as server:
            frame = fetch_metrics(server.url, run_id)
            assert frame.shape == (args.steps, n_metrics), frame.shape
            results["fetch_metrics"] = timed(lambda: fetch_metrics(server.url, run_id), args.reps)

    print(
        f"{args.steps} steps x {n_metrics} metrics = {args.steps * n_metrics:,} points; median of {args.reps}"
    )
    for key, value in results.items():
        print(f"  {key:16s} {value:8.1f} {'MiB' if key.endswith('_mib') else 'ms'}")
    if args.json:
        summary = {
            "command": _util.command_line(),
            "steps": args.steps,
            "metrics": n_metrics,
            "points": args.steps * n_metrics,
            "reps": args.reps,
            "median_ms": {k: round(v, 2) for k, v in results.items() if not k.endswith("_mib")},
            "file_mib": {
                k.removesuffix("_mib"): round(v, 3) for k, v in results.items() if k.endswith("_mib")
            },
            "loadavg": os.getloadavg(),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
