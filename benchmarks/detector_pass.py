"""Cost of one online detector pass with the window cache off and on, side by side, on PostgreSQL.

`--runs` simulated runs (`benchmarks._workload`: every canonical metric, even runs collapsing, odd runs
healthy) get `--preload` steps each in one batch, so the detector's window (`required_history` = 240
steps) is full, then `--steps` one-step batches each, round-robin over the runs. Every batch is
ingested twice through the real services (`IngestService.ingest_metrics`, which runs the detector
pass `DetectionService.process`): into a copy of the run judged by services whose detection keeps no
windows (`WindowCache(capacity=0)`: every pass reads the whole window, as before the cache) and into
a copy judged by services that keep them (the default). Both in this one process, on one scratch
database, one batch of each in turn, so they share the machine's load and the tables' size.

Reported per mode, over the streamed passes: wall time of a pass (median, mean, p95), this thread's
CPU per pass (the service's Python: reading rows into arrays, the detector, alerts) and the CPU of the
mode's PostgreSQL backends during its passes; the ratios off / on; and whether both copies of every
run ended with the same phase events, alerts and detector state (the cache must change no result).

Usage::

    python -m benchmarks.detector_pass [--runs 4] [--steps 200] [--preload 250]
                                       [--pg-url URL] [--json PATH]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import _streaming, _util
from benchmarks._workload import SimRun, make_runs
from monitor.api.wire import decode_metrics
from monitor.bootstrap import Services, build_services
from monitor.config import Settings
from monitor.detector import DetectorConfig
from monitor.domain import DirectiveInfo, Principal
from monitor.services.detection_cache import WindowCache

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MODES = ("off", "on")
P = Principal()


@dataclass
class Passes:
    """Per detector pass: wall seconds, this thread's CPU seconds, the mode's PostgreSQL CPU seconds."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    postgres: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        ms = [1e3 * x for x in self.wall]
        return {
            "passes": len(ms),
            "wall_ms_median": round(statistics.median(ms), 2),
            "wall_ms_mean": round(statistics.mean(ms), 2),
            "wall_ms_p95": round(_util.percentile(ms, 95), 2),
            "service_cpu_ms_median": round(1e3 * statistics.median(self.cpu), 2),
            "service_cpu_ms_mean": round(1e3 * statistics.mean(self.cpu), 2),
            "postgres_cpu_ms_mean": round(1e3 * statistics.mean(self.postgres), 2),
        }


class Backends:
    """CPU seconds of the PostgreSQL backends serving one mode's engine (told apart by the connection's
    `application_name`); the pool keeps its connections, so they are listed once streaming starts."""

    def __init__(self, db_url: str, application_name: str) -> None:
        self.pids = _streaming.backend_pids(db_url, application_name)

    def cpu(self) -> float:
        return sum(_streaming.process_cpu(pid) for pid in self.pids)


def timed(services: Services, passes: Passes, backends: Backends) -> None:
    """Record every `process` call of `services.detection` into `passes`."""
    process = services.detection.process

    def measured(run_id: int, *, catch_up: bool = False) -> DirectiveInfo:
        pg0, cpu0, t0 = backends.cpu(), time.thread_time(), time.perf_counter()
        directive = process(run_id, catch_up=catch_up)
        passes.wall.append(time.perf_counter() - t0)
        passes.cpu.append(time.thread_time() - cpu0)
        passes.postgres.append(backends.cpu() - pg0)
        return directive

    services.detection.process = measured  # type: ignore[method-assign]


def send(services: Services, run_id: int, run: SimRun, steps: range) -> None:
    batch_id, batch = decode_metrics(run.metrics_body(steps))
    services.ingest.ingest_metrics(P, run_id, batch_id, batch)


def judged(db_url: str) -> dict[str, Any]:
    """Per run name: its phase events, alerts and detector state, as the database holds them."""
    out: dict[str, Any] = {}
    with psycopg.connect(_util.libpq_conninfo(db_url)) as conn:
        for name, state in conn.execute("SELECT name, detector_state::text FROM runs"):
            out.setdefault(name, {})["state"] = state
        for name, step, phase in conn.execute(
            "SELECT r.name, e.step, e.phase FROM phase_events e JOIN runs r ON r.id = e.run_id ORDER BY e.id"
        ):
            out[name].setdefault("phases", []).append((step, phase))
        for name, kind, first, last, status in conn.execute(
            "SELECT r.name, a.kind, a.first_step, a.last_step, a.status FROM alerts a JOIN runs r ON r.id = a.run_id "
            "ORDER BY a.first_step, a.kind"
        ):
            out[name].setdefault("alerts", []).append((kind, first, last, status))
    return out


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    runs = make_runs(args.runs, args.preload + args.steps, 0, prefix="pass")
    passes = {mode: Passes() for mode in MODES}
    with (
        tempfile.TemporaryDirectory(prefix="lldmon_pass_") as tmp,
        _streaming.scratch_database(args.pg_url, "pass") as db_url,
    ):
        services: dict[str, Services] = {}
        for mode in MODES:
            url = f"{db_url}?application_name=lldmon_pass_{mode}"
            services[mode] = build_services(Settings(database_url=url, data_dir=Path(tmp) / mode))
        services["off"].detection.windows = WindowCache(capacity=0)
        try:
            ids = {
                (mode, run.name): services[mode].runs.register(P, f"{mode}-{run.name}", "bench", {}, [])[0].id
                for mode in MODES
                for run in runs
            }
            for run in runs:
                for mode in MODES:
                    send(services[mode], ids[mode, run.name], run, range(args.preload))
            for mode in MODES:
                timed(services[mode], passes[mode], Backends(db_url, f"lldmon_pass_{mode}"))
            for step in range(args.preload, args.preload + args.steps):
                for run in runs:
                    for mode in MODES:
                        send(services[mode], ids[mode, run.name], run, range(step, step + 1))
        finally:
            for s in services.values():
                s.close()
        results = judged(db_url)
    identical = all(results[f"off-{run.name}"] == results[f"on-{run.name}"] for run in runs)
    summary = {mode: passes[mode].summary() for mode in MODES}
    off, on = summary["off"], summary["on"]
    return {
        "command": _util.command_line(),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "environment": {"machine": _streaming.machine(), "postgresql": _util.server_version(args.pg_url)},
        "window_steps": DetectorConfig().required_history,
        "modes": summary,
        "off_over_on": {
            key: round(off[key] / on[key], 2) if on[key] else None
            for key in ("wall_ms_median", "wall_ms_mean", "service_cpu_ms_mean", "postgres_cpu_ms_mean")
        },
        "phase_events": sum(len(r.get("phases", [])) for r in results.values()),
        "alerts": sum(len(r.get("alerts", [])) for r in results.values()),
        "identical": identical,
    }


def print_report(result: dict[str, Any]) -> None:
    a = result["args"]
    print(
        f"\ndetector pass per one-step batch: {a['runs']} runs x {a['steps']} steps after {a['preload']} preloaded "
        f"(window {result['window_steps']} steps)"
    )
    for mode in MODES:
        m = result["modes"][mode]
        print(
            f"  cache {mode:<3}: wall median {m['wall_ms_median']:.2f} ms (mean {m['wall_ms_mean']:.2f}, "
            f"p95 {m['wall_ms_p95']:.2f}); service CPU median {m['service_cpu_ms_median']:.2f} ms "
            f"(mean {m['service_cpu_ms_mean']:.2f}); PostgreSQL CPU mean {m['postgres_cpu_ms_mean']:.2f} ms"
        )
    r = result["off_over_on"]
    print(
        f"  off / on: wall median {r['wall_ms_median']}x, wall mean {r['wall_ms_mean']}x, service CPU "
        f"{r['service_cpu_ms_mean']}x, PostgreSQL CPU {r['postgres_cpu_ms_mean']}x"
    )
    print(
        f"  same phase events, alerts and detector states with and without the cache: "
        f"{'yes' if result['identical'] else 'NO'} ({result['phase_events']} phase events, {result['alerts']} alerts)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200, help="one-step batches per run, after the preload")
    parser.add_argument("--preload", type=int, default=250, help="steps per run sent in one batch first")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="any database of the PostgreSQL server")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 1 or args.preload < 1:
        parser.error("--runs, --steps and --preload must be positive")
    logging.disable(logging.WARNING)  # the alerts' log lines, thousands of them
    print("command:", _util.command_line(), flush=True)
    print(f"machine: {_streaming.machine()}", flush=True)
    result = run_benchmark(args)
    print_report(result)
    if args.json:
        _streaming.write_json(args.json, result)
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
