"""Horizontal scale: one `lldmon serve` vs two `lldmon serve` processes sharing one PostgreSQL database.

The same workload goes to both configurations, each into its own fresh database: `--runs` simulated
runs (`benchmarks._workload`: every canonical metric (44 since #12) per step from the detector's scenarios, `--actions`
action records per step), each first getting `--preload` steps of metrics in one batch, then streaming
`--steps` steps as fast as the service acknowledges them (one metrics and one action batch per step,
in order, one request in flight per run, all runs concurrently).

* ``single``: every batch goes to process A;
* ``dual``: round-robin per batch across processes A and B, so one run's batches reach both: at step k
  of run r the metrics batch goes to (r + k) mod 2 and the action batch to the other one.

Reported per configuration: rows/s and steps/s of the streamed part (median over `--rounds`; rounds
alternate the order, A B B A ...), client-side p50/p99 batch latency and CPU seconds of the servers and
of the PostgreSQL backends. Correctness, on every database: each sent (run, metric, step) stored exactly
once with its value (nothing lost, nothing duplicated), `--actions` records per step, one ledger entry
per acknowledged batch, and the phase events of every run, as (phase, step) lists, identical to those of
the first single-process database.

On a 2-core machine that also runs PostgreSQL and the client, a second process can add little: the
figure to read is the ratio, and the correctness checks.

Usage::

    python -m benchmarks.scale [--runs 16] [--steps 40] [--actions 2560] [--preload 60] [--rounds 1]
        [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _streaming, _util
from benchmarks._workload import SimRun, make_runs

DEFAULT_PG = os.environ.get("LLDMON_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CONFIGS = ("single", "dual")


async def _stream_all(
    urls: list[str],
    runs: list[SimRun],
    ids: list[dict[str, int]],
    args: argparse.Namespace,
    sent: _streaming.Sent,
    meter: _streaming.CpuMeter,
) -> float:
    clients = [_streaming.async_client(url, args.runs + 2) for url in urls]
    try:
        # Preload: one batch per run, to the first process (a single batch cannot be split).
        sem = asyncio.Semaphore(4)

        async def preload(run: SimRun) -> None:
            async with sem:
                await _streaming.post_batch(
                    clients[0],
                    f"/runs/{ids[0][run.name]}/metrics",
                    run.metrics_body(range(args.preload)),
                    "metrics",
                    sent,
                )

        if args.preload:
            await asyncio.gather(*(preload(r) for r in runs))
        sent.latency_ms = {"metrics": [], "actions": []}

        async def stream(r: int, run: SimRun) -> None:
            for k in range(args.steps):
                step = args.preload + k
                first = (r + k) % len(clients)
                second = (first + 1) % len(clients)
                await _streaming.post_batch(
                    clients[first],
                    f"/runs/{ids[first][run.name]}/metrics",
                    run.metrics_body(range(step, step + 1)),
                    "metrics",
                    sent,
                )
                if run.actions:
                    await _streaming.post_batch(
                        clients[second],
                        f"/runs/{ids[second][run.name]}/actions",
                        run.actions_body(step),
                        "actions",
                        sent,
                    )

        async def poll() -> None:
            while True:
                await asyncio.to_thread(meter.poll)
                await asyncio.sleep(1.0)

        meter.start()
        poller = asyncio.create_task(poll())
        t0 = time.perf_counter()
        await asyncio.gather(*(stream(r, run) for r, run in enumerate(runs)))
        elapsed = time.perf_counter() - t0
        poller.cancel()
        return elapsed
    finally:
        for client in clients:
            await client.aclose()


def run_config(
    config: str, runs: list[SimRun], args: argparse.Namespace, tmp: Path, round_: int
) -> dict[str, Any]:
    processes = 1 if config == "single" else 2
    sent = _streaming.Sent()
    with (
        _streaming.scratch_database(args.pg_url, f"scale_{config}") as db_url,
        contextlib.ExitStack() as stack,
    ):
        servers = [
            stack.enter_context(
                _util.LldmonServer(["--database-url", db_url], tmp / f"{config}-{round_}-{i}.log")
            )
            for i in range(processes)
        ]
        urls = [s.url for s in servers]
        # Both processes serve the same database: the run ids registered through A are valid on B.
        ids = _streaming.register_runs(urls[0], runs, "bench-scale")
        meter = _streaming.CpuMeter([s.proc.pid for s in servers if s.proc is not None], db_url)
        elapsed = asyncio.run(_stream_all(urls, runs, [ids] * processes, args, sent, meter))
        cpu = meter.stop()
        for s in servers:
            if s.proc is not None and s.proc.poll() is not None:
                raise RuntimeError(f"a server died:\n{s.log_tail()}")
        full = {r.name: range(args.preload + args.steps) for r in runs}
        streamed = {r.name: range(args.preload, args.preload + args.steps) for r in runs}
        correctness = _streaming.check_database(db_url, runs, full, streamed, sent)
        events = _streaming.phase_events(db_url)
    streamed_rows = sum(r.metric_rows(s) for r in runs for s in streamed[r.name]) + sum(
        r.actions * args.steps for r in runs
    )
    return {
        "config": config,
        "processes": processes,
        "round": round_,
        "elapsed_s": round(elapsed, 2),
        "rows_per_s": round(streamed_rows / elapsed),
        "steps_per_s": round(len(runs) * args.steps / elapsed, 2),
        "latency_client": {
            k: {"p50_ms": round(_util.percentile(v, 50), 1), "p99_ms": round(_util.percentile(v, 99), 1)}
            for k, v in sent.latency_ms.items()
            if v
        },
        "cpu_seconds": cpu,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "failures": sent.failures[:10],
        "retries": sent.retries[:10],
        "correctness": correctness,
        "phase_events": {name: [[p, s] for p, s in ev] for name, ev in events.items()},
    }


def compare_phases(reference: dict[str, list[list[Any]]], other: dict[str, list[list[Any]]]) -> list[str]:
    """Names of runs whose (phase, step) lists differ."""
    return sorted(n for n in set(reference) | set(other) if reference.get(n) != other.get(n))


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    runs = make_runs(args.runs, args.preload + args.steps, args.actions, prefix="scale")
    env: dict[str, Any] = {"machine": _streaming.machine(), "postgresql": _util.server_version(args.pg_url)}
    order: list[str] = []
    for r in range(args.rounds):
        order += list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lldmon_scale_") as tmp:
        for i, config in enumerate(order):
            trial = run_config(config, runs, args, Path(tmp), i // len(CONFIGS))
            trials.append(trial)
            print(
                f"  {config:<6} round {trial['round'] + 1}: {trial['rows_per_s']:>9,} rows/s "
                f"{trial['steps_per_s']:>7.2f} steps/s  correctness {'OK' if trial['correctness']['ok'] else 'MISMATCH'}",
                flush=True,
            )
    reference = next(t for t in trials if t["config"] == "single")["phase_events"]
    for t in trials:
        t["phases_differ"] = compare_phases(reference, t["phase_events"])
    summary: dict[str, Any] = {}
    for config in CONFIGS:
        mine = [t for t in trials if t["config"] == config]
        summary[config] = {
            "processes": mine[0]["processes"],
            "rows_per_s_median": round(statistics.median(t["rows_per_s"] for t in mine)),
            "steps_per_s_median": round(statistics.median(t["steps_per_s"] for t in mine), 2),
            "rounds": [t["rows_per_s"] for t in mine],
        }
    summary["dual_vs_single"] = round(
        summary["dual"]["rows_per_s_median"] / summary["single"]["rows_per_s_median"], 3
    )
    phase_events = sum(len(v) for v in reference.values())
    correctness = {
        "rows_ok": all(t["correctness"]["ok"] for t in trials),
        "phases_identical": all(not t["phases_differ"] for t in trials),
        "phase_events_per_database": phase_events,
        "runs_with_phase_changes": sum(1 for v in reference.values() if len(v) > 1),
    }
    correctness["ok"] = correctness["rows_ok"] and correctness["phases_identical"] and phase_events > 0
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    for t in trials:
        del t["phase_events"]
    return {
        "command": _util.command_line(),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "environment": env,
        "workload": {
            "runs": args.runs,
            "streamed_steps_per_run": args.steps,
            "metrics_per_step": len(runs[0].values),
            "actions_per_step": args.actions,
            "preload_steps": args.preload,
        },
        "summary": summary,
        "correctness": correctness,
        "trials": trials,
    }


def print_report(result: dict[str, Any]) -> None:
    s, c, w = result["summary"], result["correctness"], result["workload"]
    print(
        f"\n{w['runs']} runs x {w['streamed_steps_per_run']} steps ({w['metrics_per_step']} metrics + "
        f"{w['actions_per_step']} actions per step) after {w['preload_steps']} preloaded steps"
    )
    for config in CONFIGS:
        mine = [t for t in result["trials"] if t["config"] == config]
        cpu = mine[-1]["cpu_seconds"]
        lat = mine[-1]["latency_client"]
        print(
            f"  {config:<6} ({s[config]['processes']} process{'es' if s[config]['processes'] > 1 else ''}): "
            f"{s[config]['rows_per_s_median']:>9,} rows/s, {s[config]['steps_per_s_median']:.2f} steps/s; "
            + "; ".join(f"{k} p50/p99 {v['p50_ms']}/{v['p99_ms']} ms" for k, v in lat.items())
            + f"; CPU s server {cpu['server']}, postgres {cpu['postgres']}, client {cpu['client']}"
        )
    print(f"  dual / single throughput: {s['dual_vs_single']:.2f}x")
    print(
        f"  correctness: rows {'OK' if c['rows_ok'] else 'MISMATCH'} in every database; phase events "
        f"({c['phase_events_per_database']} per database, {c['runs_with_phase_changes']} runs with phase changes) "
        f"{'identical' if c['phases_identical'] else 'DIFFER'} across configurations"
    )
    for t in result["trials"]:
        if t["phases_differ"]:
            print(
                f"  ! {t['config']} round {t['round'] + 1}: phases differ for {', '.join(t['phases_differ'])}"
            )
        for failure in t["failures"]:
            print(f"  ! {t['config']}: {failure}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40, help="streamed steps per run")
    parser.add_argument("--actions", type=int, default=2560, help="action records per step")
    parser.add_argument("--preload", type=int, default=60, help="steps of metrics sent first, in one batch")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of (single, dual), order alternating")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="any database of the PostgreSQL server")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if min(args.runs, args.steps, args.rounds) < 1 or args.actions < 0 or args.preload < 0:
        parser.error("--runs, --steps and --rounds must be >= 1, --actions and --preload >= 0")
    print("command:", _util.command_line(), flush=True)
    print(f"machine: {_streaming.machine()}", flush=True)
    result = run_benchmark(args)
    print_report(result)
    if args.json:
        _streaming.write_json(args.json, result)
    return 0 if result["correctness"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
