"""`lldmon import` cost: parsing a large verl JSONL (time, peak memory) and writing it into a run.

Generates a verl `file`-logger JSONL of `--steps` steps x `--metrics` metrics (random walks, a few NaN as
orjson writes them: null), then
1. parses it in a fresh process (`load_log`) and reports seconds, MB/s and the process's peak RSS next to
   the file size and to the RSS of the same process before parsing;
2. imports a `--import-steps` file with `ImportService` into an embedded SQLite and into a scratch,
   migrated PostgreSQL database made next to `--pg-url` (dropped afterwards; `--no-pg` leaves it out),
   `--chunk-steps` steps per ingest batch, with the detector running after each batch as online, and
   reports steps/s and values/s.

Usage::

    python -m benchmarks.importing [--steps 40000] [--metrics 60] [--import-steps 5000]
                                   [--chunk-steps 50] [--no-pg] [--json PATH]
                                   [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _streaming, _util
from monitor.importers.names import VERL_NAMES

DEFAULT_PG = os.environ.get("LLDMON_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

_PARSE = """
import json, resource, sys, time
from monitor.importers import load_log
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
log = load_log([sys.argv[1]], "verl-jsonl")
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "rss_before_kb": before, "rss_peak_kb": peak,
                  "steps": len(log), "values": log.n_points}))
"""


def write_jsonl(path: Path, steps: int, metrics: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    names = [*list(VERL_NAMES)[:5], *(f"actor/extra_{i}" for i in range(max(0, metrics - 5)))][:metrics]
    level = [1.0] * len(names)
    with open(path, "w", encoding="utf-8") as handle:
        for step in range(steps):
            data: dict[str, float | None] = {}
            for i, name in enumerate(names):
                level[i] += rng.gauss(0.0, 0.01)
                data[name] = None if rng.random() < 1e-4 else level[i]
            handle.write(json.dumps({"step": step, "data": data}) + "\n")


def parse_in_child(path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _PARSE, str(path)], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def import_into(url: str, path: Path, chunk_steps: int) -> tuple[int, int, float]:
    from monitor.api.app import build_state
    from monitor.config import Settings
    from monitor.domain import Principal
    from monitor.importers import load_log
    from monitor.services.importing import ImportService

    log = load_log([path], "verl-jsonl")
    state = build_state(Settings(database_url=url, webhook_urls=[], slack_webhook_urls=[]))
    service = ImportService(state.db, state.runs, state.ingest, state.query, state.alerts)
    start = time.perf_counter()
    service.import_log(
        Principal(), log, name=f"bench-{time.time_ns()}", project="bench", chunk_steps=chunk_steps
    )
    seconds = time.perf_counter() - start
    state.dispatcher.close()
    state.db.dispose()
    return len(log), log.n_points, seconds


def main(argv: list[str] | None = None) -> None:
    logging.getLogger("lldmon.alerts").disabled = True  # the log sink would print every alert
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40_000, help="steps of the file that is parsed")
    parser.add_argument("--metrics", type=int, default=60)
    parser.add_argument("--import-steps", type=int, default=5_000, help="steps of the file that is imported")
    parser.add_argument("--chunk-steps", type=int, default=50)
    parser.add_argument(
        "--pg-url",
        default=DEFAULT_PG,
        help="any database of the PostgreSQL server; a scratch database lldmon_bench_import_* is made next to it",
    )
    parser.add_argument("--no-pg", action="store_true", help="import into SQLite only")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    summary: dict[str, Any] = {
        "command": _util.command_line(),
        "args": {k: getattr(args, k) for k in ("steps", "metrics", "import_steps", "chunk_steps")},
        "import": {},
    }

    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.jsonl"
        write_jsonl(big, args.steps, args.metrics)
        size_mb = big.stat().st_size / 1e6
        parsed = parse_in_child(big)
        grown = (parsed["rss_peak_kb"] - parsed["rss_before_kb"]) / 1e3
        print(
            f"parse {size_mb:.1f} MB verl JSONL ({parsed['steps']:.0f} steps, {parsed['values']:.0f} values): "
            f"{parsed['seconds']:.2f} s = {size_mb / parsed['seconds']:.1f} MB/s; "
            f"peak RSS {parsed['rss_peak_kb'] / 1e3:.0f} MB (+{grown:.0f} MB over the idle process, "
            f"{grown / size_mb:.2f} x the file)"
        )
        summary["parse"] = {
            "file_mb": round(size_mb, 2),
            "steps": parsed["steps"],
            "values": parsed["values"],
            "seconds": round(parsed["seconds"], 3),
            "mb_per_s": round(size_mb / parsed["seconds"], 1),
            "rss_before_mb": round(parsed["rss_before_kb"] / 1e3, 1),
            "rss_peak_mb": round(parsed["rss_peak_kb"] / 1e3, 1),
            "rss_growth_mb": round(grown, 1),
            "rss_growth_per_file_mb": round(grown / size_mb, 2),
        }
        small = Path(tmp) / "small.jsonl"
        write_jsonl(small, args.import_steps, args.metrics, seed=1)
        with contextlib.ExitStack() as stack:
            targets = [("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}")]
            if not args.no_pg:
                summary["postgresql"] = _util.server_version(args.pg_url)
                targets.append(
                    ("postgresql", stack.enter_context(_streaming.scratch_database(args.pg_url, "import")))
                )
            for label, url in targets:
                steps, values, seconds = import_into(url, small, args.chunk_steps)
                print(
                    f"import into {label}, {args.chunk_steps} steps per batch: {steps} steps, {values} values in "
                    f"{seconds:.2f} s = {steps / seconds:.0f} steps/s, {values / seconds:.0f} values/s"
                )
                summary["import"][label] = {
                    "steps": steps,
                    "values": values,
                    "seconds": round(seconds, 3),
                    "steps_per_s": round(steps / seconds),
                    "values_per_s": round(values / seconds),
                }
    print(f"load average: {os.getloadavg()[0]:.1f}")
    if args.json:
        summary["loadavg"] = os.getloadavg()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
