"""Many runs at once: `--runs` simulated training runs streaming to one `lldmon serve` on PostgreSQL.

Each run sends, per optimizer step, what a Search-R1-sized job with lldmon's hooks sends: one metrics
batch with every canonical metric (44 since #12) (scenario values, so the online detector finds phases and opens
alerts) and one action batch of `--actions` records (default 2,560), waiting for the acknowledgement as
the real client does: in one `/combined` request, as the hooks send a step (`--protocol combined`, the
default), or as a metrics request then an actions request (`separate`; `both` runs one trial of each). Step k of run r is *scheduled* at t0 + r/runs/rate + k/rate
(`--rate` steps/s per run, staggered starts); a run that falls behind sends its next step at once.
Before the clock starts every run gets `--preload` steps of metrics in one batch, so the detector has
history from the first streamed step on (its window is `required_history`, 240 steps: with the default
100, the window fills as the run streams; `--preload 250` starts it full).

Streaming stops at t0 + `--seconds`: no step is started after that, the batches in flight finish.
Reported:

* achieved steps/s (steps whose two batches were acknowledged inside the window) vs offered
  (runs x rate), and steps left unsent at the end;
* backlog: lag = acknowledgement time - scheduled time per step; median lag of the steps scheduled
  in the first and the last third of the window, and the number of scheduled-but-unacknowledged
  steps sampled every second. Sustained = the last third's median lag is under one step period and
  did not grow by more than half a period over the first third;
* p50/p99 round-trip latency of metrics and action batches (client side), and the server's own
  per-batch transaction time (`lldmon_ingest_latency_seconds`);
* detector time per step from the service's `lldmon_detector_seconds` histogram (one detector pass
  per metrics batch = per step): mean and bucket bounds of p50/p99;
* where the time goes: CPU seconds of the server process, of the PostgreSQL backends serving the
  scratch database and of this client, over the window, against the machine's cores x seconds;
* correctness: every sent (run, metric, step) stored once with its value, `--actions` records per
  step, one ledger entry per acknowledged batch; phase events and alerts written by the detector.

With `--confirm`, an offered rate that is not sustained is followed by a second run with as many runs
as 80 % of the achieved steps/s carries: the highest rate shown sustained is `max_sustained_steps_per_s`.
With `--workers N` > 1 the Prometheus figures are those of the one worker that answered the scrape.

Usage::

    python -m benchmarks.concurrent_runs [--runs 50] [--rate 1] [--seconds 60] [--actions 2560]
        [--preload 100] [--workers 1] [--confirm] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks import _streaming, _util
from benchmarks._workload import SimRun, make_runs

DEFAULT_PG = os.environ.get("LLDMON_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@dataclass
class StepResult:
    run: int
    scheduled: float  # seconds after t0
    done: float | None  # acknowledgement of the step's last batch, seconds after t0; None if failed


async def stream(
    client: httpx.AsyncClient,
    index: int,
    run: SimRun,
    run_id: int,
    args: argparse.Namespace,
    t0: float,
    sent: _streaming.Sent,
    results: list[StepResult],
) -> None:
    offset = index / (args.runs * args.rate)
    period = 1.0 / args.rate
    base = f"/runs/{run_id}"
    for k in range(args.max_steps):
        scheduled = offset + k * period
        if scheduled >= args.seconds or time.perf_counter() - t0 >= args.seconds:
            return
        delay = t0 + scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        step = args.preload + k
        if args.protocol == "combined" and run.actions:
            body = run.combined_body(step)
            ok = await _streaming.post_batch(client, base + "/combined", body, "combined", sent)
            results.append(StepResult(index, scheduled, time.perf_counter() - t0 if ok else None))
            continue
        metrics = run.metrics_body(range(step, step + 1))
        ok = await _streaming.post_batch(client, base + "/metrics", metrics, "metrics", sent)
        if ok and run.actions:
            ok = await _streaming.post_batch(
                client, base + "/actions", run.actions_body(step), "actions", sent
            )
        results.append(StepResult(index, scheduled, time.perf_counter() - t0 if ok else None))


async def sample_backlog(
    results: list[StepResult],
    args: argparse.Namespace,
    t0: float,
    samples: list[tuple[float, int]],
    meter: _streaming.CpuMeter,
) -> None:
    """Every second: steps scheduled so far minus steps acknowledged so far; CPU meter poll."""
    period = 1.0 / args.rate
    while (now := time.perf_counter() - t0) < args.seconds:
        scheduled = sum(
            min(args.max_steps, int((now - i / (args.runs * args.rate)) / period) + 1)
            for i in range(args.runs)
            if now >= i / (args.runs * args.rate)
        )
        samples.append((round(now, 1), scheduled - sum(r.done is not None for r in results)))
        await asyncio.to_thread(meter.poll)
        await asyncio.sleep(1.0)


async def run_streams(
    base_url: str,
    runs: list[SimRun],
    ids: dict[str, int],
    args: argparse.Namespace,
    sent: _streaming.Sent,
    meter: _streaming.CpuMeter,
) -> tuple[list[StepResult], list[tuple[float, int]], float]:
    results: list[StepResult] = []
    samples: list[tuple[float, int]] = []
    async with _streaming.async_client(base_url, args.runs + 2) as client:
        t0 = time.perf_counter()
        await asyncio.gather(
            sample_backlog(results, args, t0, samples, meter),
            *(stream(client, i, r, ids[r.name], args, t0, sent, results) for i, r in enumerate(runs)),
        )
        elapsed = time.perf_counter() - t0
    return results, samples, elapsed


def preload(
    base_url: str, runs: list[SimRun], ids: dict[str, int], steps: int, sent: _streaming.Sent
) -> None:
    async def go() -> None:
        async with _streaming.async_client(base_url, 4) as client:
            sem = asyncio.Semaphore(4)

            async def one(run: SimRun) -> None:
                async with sem:
                    await _streaming.post_batch(
                        client,
                        f"/runs/{ids[run.name]}/metrics",
                        run.metrics_body(range(steps)),
                        "metrics",
                        sent,
                    )

            await asyncio.gather(*(one(r) for r in runs))

    if steps:
        asyncio.run(go())


def summarise_steps(results: list[StepResult], args: argparse.Namespace, elapsed: float) -> dict[str, Any]:
    period = 1.0 / args.rate
    done = [r for r in results if r.done is not None]
    in_window = [r for r in done if r.done is not None and r.done <= args.seconds]
    offered = args.runs * args.rate
    scheduled_total = sum(
        min(args.max_steps, math.ceil((args.seconds - i / offered) / period)) for i in range(args.runs)
    )
    # Lag of the steps acknowledged in the first and in the last third of the window: under a growing
    # backlog the later acknowledgements are of ever older steps.
    third = args.seconds / 3
    lags = {
        "first": [r.done - r.scheduled for r in done if r.done is not None and r.done < third],
        "last": [
            r.done - r.scheduled for r in done if r.done is not None and 2 * third <= r.done <= args.seconds
        ],
    }
    lag_first = statistics.median(lags["first"]) if lags["first"] else None
    lag_last = statistics.median(lags["last"]) if lags["last"] else None
    sustained = (
        lag_first is not None
        and lag_last is not None
        and lag_last < period
        and lag_last - lag_first <= period / 2
        and len(done) >= 0.95 * scheduled_total
    )
    return {
        "offered_steps_per_s": offered,
        "achieved_steps_per_s": round(len(in_window) / args.seconds, 2),
        "steps_scheduled": scheduled_total,
        "steps_acknowledged": len(done),
        "steps_acknowledged_in_window": len(in_window),
        "steps_unsent": scheduled_total - len(results),
        "steps_failed": len(results) - len(done),
        "elapsed_s": round(elapsed, 2),
        "lag_s_median_first_third": _round(lag_first),
        "lag_s_median_last_third": _round(lag_last),
        "lag_s_p99_last_third": _round(_util.percentile(lags["last"], 99) if lags["last"] else None),
        "sustained": sustained,
    }


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _latency(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50_ms": None, "p99_ms": None}
    return {
        "n": len(values),
        "p50_ms": round(_util.percentile(values, 50), 1),
        "p99_ms": round(_util.percentile(values, 99), 1),
    }


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    args.max_steps = int(args.seconds * args.rate) + 2
    runs = make_runs(args.runs, args.preload + args.max_steps, args.actions, prefix="conc")
    env: dict[str, Any] = {"machine": _streaming.machine(), "postgresql": _util.server_version(args.pg_url)}
    sent = _streaming.Sent()
    with (
        tempfile.TemporaryDirectory(prefix="lldmon_conc_") as tmp,
        _streaming.scratch_database(args.pg_url, "conc") as db_url,
    ):
        server_args = ["--database-url", db_url, "--workers", str(args.workers)]
        with _util.LldmonServer(server_args, Path(tmp) / "server.log") as server:
            ids = _streaming.register_runs(server.url, runs, "bench-concurrent")
            preload(server.url, runs, ids, args.preload, sent)
            sent.latency_ms = {"metrics": [], "actions": [], "combined": []}  # the streamed batches' only
            assert server.proc is not None
            meter = _streaming.CpuMeter([server.proc.pid], db_url)
            before = _streaming.scrape(server.url)
            meter.start()
            results, backlog, elapsed = asyncio.run(run_streams(server.url, runs, ids, args, sent, meter))
            cpu = meter.stop()
            after = _streaming.scrape(server.url)
            if server.proc.poll() is not None:
                raise RuntimeError(f"the server died:\n{server.log_tail()}")
            server_log = server.log_tail(40) if sent.failures or sent.retries else ""
        last = max((r.done or 0.0 for r in results), default=0.0)
        streamed = {i: sum(1 for s in results if s.run == i) for i in range(len(runs))}
        correctness = _streaming.check_database(
            db_url,
            runs,
            {r.name: range(args.preload + streamed[i]) for i, r in enumerate(runs)},
            {r.name: range(args.preload, args.preload + streamed[i]) for i, r in enumerate(runs)},
            sent,
        )
        events = _streaming.phase_events(db_url)
        correctness["phase_events"] = sum(len(v) for v in events.values())
        correctness["phases_seen"] = sorted({p for v in events.values() for p, _ in v})
        correctness["alerts"] = _streaming.alert_count(db_url)
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    cores_s = (os.cpu_count() or 1) * max(elapsed, last)
    streamed_steps = sum(r.done is not None for r in results)
    return {
        "command": _util.command_line(),
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "max_steps")},
        "environment": env,
        "steps": summarise_steps(results, args, elapsed),
        "backlog_samples": backlog,
        "latency_client": {k: _latency(v) for k, v in sent.latency_ms.items() if v},
        "latency_server_transaction": {
            kind: _streaming.histogram_delta(before, after, "lldmon_ingest_latency_seconds", f"kind={kind}")
            for kind in (("combined",) if args.protocol == "combined" else ("metrics", "actions"))
        },
        "detector_per_step": _streaming.histogram_delta(before, after, "lldmon_detector_seconds"),
        "cpu_seconds": cpu,
        "cpu_share_of_machine": {k: round(v / cores_s, 3) for k, v in cpu.items()},
        "cpu_ms_per_step": {k: round(1e3 * v / max(streamed_steps, 1), 1) for k, v in cpu.items()},
        "failures": sent.failures[:10],
        "retries": sent.retries[:10],
        "server_log_tail": server_log.splitlines(),
        "correctness": correctness,
    }


def print_report(result: dict[str, Any]) -> None:
    s, a = result["steps"], result["args"]
    print(
        f"\n{a['runs']} runs x {a['rate']} step/s for {a['seconds']} s, {a['actions']} action records per step"
    )
    print(
        f"  steps/s: offered {s['offered_steps_per_s']:.1f}, achieved {s['achieved_steps_per_s']:.1f} "
        f"({s['steps_acknowledged_in_window']}/{s['steps_scheduled']} scheduled steps acknowledged in the window, "
        f"{s['steps_unsent']} never sent, {s['steps_failed']} failed)"
    )
    print(
        f"  lag (ack - schedule), median: first third {s['lag_s_median_first_third']} s, last third "
        f"{s['lag_s_median_last_third']} s (p99 {s['lag_s_p99_last_third']} s) -> "
        f"{'sustained' if s['sustained'] else 'NOT sustained (backlog grows)'}"
    )
    samples = result["backlog_samples"]
    if samples:
        picks = samples[:: max(1, len(samples) // 6)]
        print("  backlog (scheduled - acknowledged steps): " + ", ".join(f"t={t:.0f}s {n}" for t, n in picks))
    for kind, lat in result["latency_client"].items():
        srv = result["latency_server_transaction"][kind]
        print(
            f"  {kind:<8} batches: {lat['n']:>6}, round trip p50 {lat['p50_ms']} ms p99 {lat['p99_ms']} ms; "
            f"server transaction mean {srv['mean_ms']} ms (p99 <= {srv['p99_le_ms']} ms)"
        )
    d = result["detector_per_step"]
    print(
        f"  detector per step: {d['count']} passes, mean {d['mean_ms']} ms, p50 <= {d['p50_le_ms']} ms, "
        f"p99 <= {d['p99_le_ms']} ms (lldmon_detector_seconds: lock, load window, update, persist)"
    )
    cpu, share = result["cpu_seconds"], result["cpu_share_of_machine"]
    print(
        "  CPU seconds: "
        + ", ".join(f"{k} {v} s ({share[k]:.0%} of the machine)" for k, v in cpu.items())
        + f"; load average at the end {result['environment']['loadavg_end']}"
    )
    print(
        "  CPU per acknowledged step: "
        + ", ".join(f"{k} {v} ms" for k, v in result["cpu_ms_per_step"].items())
    )
    c = result["correctness"]
    print(
        f"  correctness: metric rows stored {c['metric_rows_stored']:,} == acknowledged {c['metric_rows_acknowledged']:,} "
        f"(lost {c['metric_rows_lost']}, unexpected {c['metric_rows_unexpected']}, wrong values {c['metric_values_wrong']}); "
        f"action rows stored {c['action_rows_stored']:,} == acknowledged {c['action_rows_acknowledged']:,}"
        + (
            f" ({c['action_blocks_decoded']} newest blocks decoded, {c['action_blocks_wrong']} differ from what was sent)"
            if c.get("action_blocks_decoded")
            else ""
        )
        + "; "
        f"{c['phase_events']} phase events ({', '.join(c['phases_seen'])}), {c['alerts']} alerts -> "
        f"{'OK' if c['ok'] else 'MISMATCH'}"
    )
    for failure in result["failures"]:
        print("  ! " + failure)
    if result["retries"]:
        print(
            f"  {result['correctness']['retries']} batch(es) retried after a dropped connection: {result['retries'][:3]}"
        )
    if result["server_log_tail"]:
        print("  server log (tail):\n" + "\n".join("    " + line for line in result["server_log_tail"][-15:]))


def _trial_summary(result: dict[str, Any]) -> dict[str, Any]:
    s = result["steps"]
    keys = ("offered_steps_per_s", "achieved_steps_per_s", "sustained", "lag_s_median_last_third")
    p99 = {f"{kind}_p99_ms": latency["p99_ms"] for kind, latency in result["latency_client"].items()}
    return {k: s[k] for k in keys} | p99 | {"loadavg_end": result["environment"]["loadavg_end"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rate", type=float, default=1.0, help="steps per second per run")
    parser.add_argument("--seconds", type=float, default=60.0, help="streaming window")
    parser.add_argument("--actions", type=int, default=2560, help="action records per step")
    parser.add_argument("--preload", type=int, default=100, help="steps of metrics sent before the clock")
    parser.add_argument("--workers", type=int, default=1, help="lldmon serve --workers (default 1)")
    parser.add_argument(
        "--confirm",
        action="store_true",
        help="if the offered rate is not sustained, run again with as many runs as 80%% of the achieved "
        "steps/s carries, to confirm a sustained rate",
    )
    parser.add_argument(
        "--protocol",
        choices=("combined", "separate", "both"),
        default="combined",
        help="a step as one /combined request (what the hooks send) or as /metrics then /actions; "
        "both: one trial each, separate first, compared at the end",
    )
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="any database of the PostgreSQL server")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.rate <= 0 or args.seconds <= 0 or args.actions < 0 or args.preload < 0:
        parser.error("--runs, --rate and --seconds must be positive, --actions and --preload >= 0")
    print("command:", _util.command_line(), flush=True)
    print(f"machine: {_streaming.machine()}", flush=True)
    protocols = ["separate", "combined"] if args.protocol == "both" else [args.protocol]
    results = {p: measure(argparse.Namespace(**{**vars(args), "protocol": p})) for p in protocols}
    if len(results) > 1:
        print("\nside by side (CPU ms per acknowledged step; achieved steps/s; sustained):")
        for protocol, result in results.items():
            cpu = ", ".join(f"{k} {v}" for k, v in result["cpu_ms_per_step"].items())
            s = result["steps"]
            print(f"  {protocol:<9} {cpu}; {s['achieved_steps_per_s']} steps/s; sustained {s['sustained']}")
    if args.json:
        _streaming.write_json(args.json, results if len(results) > 1 else results[protocols[0]])
    return 0 if all(r["correctness"]["ok"] for r in results.values()) else 1


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One protocol's trial (and its confirmation with fewer runs if asked and not sustained)."""
    print(f"\nprotocol: {args.protocol}", flush=True)
    result = run_benchmark(args)
    print_report(result)
    result["trials"] = [{"runs": args.runs, **_trial_summary(result)}]
    if args.confirm and not result["steps"]["sustained"]:
        runs = max(1, math.floor(0.8 * result["steps"]["achieved_steps_per_s"] / args.rate))
        print(f"\nnot sustained: confirming with {runs} runs (80% of the achieved rate)", flush=True)
        retry = run_benchmark(argparse.Namespace(**{**vars(args), "runs": runs}))
        print_report(retry)
        result["trials"].append({"runs": runs, **_trial_summary(retry)})
        result["correctness"]["ok"] = result["correctness"]["ok"] and retry["correctness"]["ok"]
    sustained = [t for t in result["trials"] if t["sustained"]]
    result["max_sustained_steps_per_s"] = max((t["achieved_steps_per_s"] for t in sustained), default=None)
    print(f"\nmax sustained (measured): {result['max_sustained_steps_per_s']} steps/s")
    return result


if __name__ == "__main__":
    sys.exit(main())
