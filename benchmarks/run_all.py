"""Run every benchmark, one subprocess each, and collect their figures into one JSON file and one table.

Benchmarks (each writes its own JSON summary, which is embedded in `results.json`):

* ``ingest``           raw COPY vs lldmon over HTTP into PostgreSQL and SQLite vs the MLflow server
* ``actions``          action records: API ingest vs raw row COPY vs MLflow (values/s), disk bytes per
                       record (PostgreSQL, SQLite; service storage and the old row layout), read latency
* ``concurrent_runs``  50 runs streaming at 1 step/s each to one `lldmon serve` (with --confirm)
* ``scale``            one vs two `lldmon serve` processes on one PostgreSQL database
* ``detection``        detector quality on generated + real runs, and its cost per step
* ``detector_pass``    one online detector pass through the services on PostgreSQL, window cache off vs on
* ``measure``          `measure_step` on a Search-R1-sized batch
* ``hooks``            TRL hooks overhead per training step
* ``dashboard``        dashboard callback latencies on a 10,000-step run
* ``history``          run history on a 10,000-step x 30-metric run: `runs show`, export CSV / Parquet,
                       `fetch_metrics` over HTTP
* ``importing``        `lldmon import`: parsing a large verl JSONL (time, peak memory), importing 5,000 steps
                       into SQLite and PostgreSQL through the ingest path

`--out DIR` receives `results.json` (machine: CPU count and model, load average before and after each
benchmark, date, git commit; per benchmark: command, exit status, duration, its JSON summary),
`results.md` (one row per benchmark with its key figures and the exact command) and `<name>.log` (its
output). `--quick` runs each at a minimal size: a smoke test of the scripts, not a measurement.

Usage::

    python -m benchmarks.run_all [--quick] [--out benchmarks/results] [--only NAME,...] [--skip NAME,...]
                                 [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results"
DEFAULT_PG = os.environ.get("LLDMON_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True)
class Bench:
    name: str
    what: str
    module: str
    json_flag: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    uses_pg: bool
    timeout_s: int


BENCHES = (
    Bench(
        "ingest",
        "ingest throughput: raw COPY, lldmon -> PostgreSQL / SQLite over HTTP, MLflow log-batch",
        "benchmarks.ingest",
        "--out",
        (),
        ("--rounds", "1", "--batches", "2", "--warmup", "1", "--mlflow-batches", "1", "--batch-rows", "1000"),
        True,
        1800,
    ),
    Bench(
        "actions",
        "action records (Search-R1-shaped steps): API ingest vs raw row COPY vs MLflow, disk bytes per record, reads",
        "benchmarks.actions",
        "--json",
        (),
        ("--quick",),
        True,
        1800,
    ),
    Bench(
        "concurrent_runs",
        "many runs streaming at once to one lldmon serve (per step: 28 metrics + action records)",
        "benchmarks.concurrent_runs",
        "--json",
        ("--confirm",),
        ("--runs", "3", "--seconds", "3", "--actions", "64", "--preload", "75"),
        True,
        900,
    ),
    Bench(
        "scale",
        "horizontal scale: 1 vs 2 lldmon serve processes on one PostgreSQL database",
        "benchmarks.scale",
        "--json",
        (),
        ("--runs", "3", "--steps", "4", "--actions", "64", "--preload", "60"),
        True,
        900,
    ),
    Bench(
        "detection",
        "detector quality and cost per step",
        "benchmarks.detection",
        "--json",
        ("--quiet",),
        ("--collapse", "2", "--controls", "1", "--cost-steps", "200", "--no-real", "--quiet", "--jobs", "1"),
        False,
        1800,
    ),
    Bench(
        "detector_pass",
        "online detector pass per one-step batch (services on PostgreSQL): window cache off vs on",
        "benchmarks.detector_pass",
        "--json",
        (),
        ("--runs", "2", "--steps", "10", "--preload", "250"),
        True,
        900,
    ),
    Bench(
        "measure",
        "measure_step on a Search-R1-sized batch (2,560 x 1,024 tokens), CPU",
        "benchmarks.measure",
        "--json",
        (),
        ("--responses", "40", "--tokens", "256", "--reps", "2", "--warmup", "1", "--naive-responses", "10"),
        False,
        900,
    ),
    Bench(
        "hooks",
        "TRL hooks overhead per GRPO step (tiny Qwen2, tool calling)",
        "benchmarks.hooks",
        "--json",
        (),
        ("--reps", "1", "--steps", "4"),
        False,
        1800,
    ),
    Bench(
        "dashboard",
        "dashboard callbacks on a 10,000-step run with 30 metrics",
        "benchmarks.dashboard",
        "--out",
        (),
        ("--steps", "1000", "--reps", "2"),
        False,
        1800,
    ),
    Bench(
        "history",
        "run history on a 10,000-step run with 30 metrics: runs show, export, fetch_metrics over HTTP",
        "benchmarks.history",
        "--json",
        (),
        ("--steps", "500", "--reps", "1"),
        False,
        900,
    ),
    Bench(
        "importing",
        "lldmon import: parse a 40,000-step x 60-metric verl JSONL, import 5,000 steps into SQLite / PostgreSQL",
        "benchmarks.importing",
        "--json",
        (),
        ("--steps", "500", "--metrics", "20", "--import-steps", "100", "--chunk-steps", "50"),
        True,
        1800,
    ),
)
NAMES = tuple(b.name for b in BENCHES)


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        mem_gib = round(int(f.readline().split()[1]) / 2**20, 1)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": mem_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + (" (with local changes)" if dirty.stdout.strip() else "")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_one(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    json_path = args.out / f"{bench.name}.json"
    with contextlib.suppress(FileNotFoundError):
        json_path.unlink()
    argv = [sys.executable, "-m", bench.module, *(bench.quick if args.quick else bench.full)]
    if bench.uses_pg:
        argv += ["--pg-url", args.pg_url]
    argv += [bench.json_flag, str(json_path)]
    log_path = args.out / f"{bench.name}.log"
    print(f"== {bench.name}: {shlex.join(argv)}", flush=True)
    before = loadavg()
    t0 = time.perf_counter()
    timeout = bench.timeout_s if not args.quick else 300
    with log_path.open("w") as log:
        try:
            rc = subprocess.run(
                argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = None
    duration = time.perf_counter() - t0
    summary: Any = None
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        summary = json.loads(json_path.read_text())
    status = "ok" if rc == 0 else ("timeout" if rc is None else f"exit {rc}")
    print(f"   {status} in {duration:.0f} s (log: {log_path})", flush=True)
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        print("\n".join("   | " + line for line in tail), flush=True)
    shown = [_relative(a) for a in argv[3:]]
    if bench.uses_pg and args.pg_url == DEFAULT_PG:  # the scripts' own default: leave it out
        i = shown.index("--pg-url")
        del shown[i : i + 2]
    return {
        "command": shlex.join(["python", "-m", bench.module, *shown]),
        "what": bench.what,
        "status": status,
        "returncode": rc,
        "duration_s": round(duration, 1),
        "loadavg_before": before,
        "loadavg_after": loadavg(),
        "log": str(log_path),
        "summary": summary,
    }


def _relative(arg: str) -> str:
    """Paths under the repository as typed from its root."""
    path = Path(arg)
    if path.is_absolute() and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return arg


# --- key figures per benchmark, for the table -------------------------------------------------------


def _ingest(s: dict[str, Any]) -> str:
    m = s["modes"]
    parts = [
        f"raw COPY {m['copy']['rows_per_s_median']:,} rows/s",
        f"lldmon -> PostgreSQL {m['lldmon-pg']['rows_per_s_median']:,} rows/s = **{m['lldmon-pg']['ratio_vs_copy']:.1%} of COPY** "
        f"(target >= 50 %), p50/p99 {m['lldmon-pg']['latency_ms_p50']:.0f}/{m['lldmon-pg']['latency_ms_p99']:.0f} ms per batch",
        f"lldmon -> SQLite {m['lldmon-sqlite']['rows_per_s_median']:,} rows/s",
    ]
    ml = s.get("mlflow", {})
    if "skipped" in ml:
        parts.append(f"MLflow skipped: {ml['skipped']}")
    elif "mlflow" in m:
        parts.append(
            f"MLflow {ml.get('version', '')} log-batch {m['mlflow']['rows_per_s_median']:,} rows/s: lldmon = "
            f"**{ml['lldmon_pg_vs_mlflow']:.1f}x MLflow** (target >= 30x; paired {ml['lldmon_pg_vs_mlflow_paired_median']:.1f}x)"
        )
    return "; ".join(parts)


def _actions(s: dict[str, Any]) -> str:
    m, ratios, disk = s["ingest"]["modes"], s["ingest"]["ratios"], s["disk"]
    api = m["api-pg"]
    parts = [
        f"storage {s['environment']['storage']}, {s['workload']['records_per_step']:,} records/step: "
        f"API -> PostgreSQL {api['values_per_s_median']:,} values/s ({api['records_per_s_median']:,} records/s) = "
        f"**{ratios['api-pg/copy']:.2f}x raw row COPY** (target >= 1.0x; paired {ratios['api-pg/copy paired']:.2f}x)"
    ]
    if "api-pg/mlflow" in ratios:
        parts.append(
            f"**{ratios['api-pg/mlflow']:.0f}x MLflow** (target >= 30x; MLflow {m['mlflow']['values_per_s_median']:,} values/s)"
        )
    elif "skipped" in s.get("mlflow", {}):
        parts.append(f"MLflow skipped: {s['mlflow']['skipped']}")
    pg = disk["postgresql"]
    text = (
        f"PostgreSQL **{pg['service']['bytes_per_record']} B/record** (target <= 24; old row layout "
        f"{pg['old_row_layout_copy']['bytes_per_record']} B)"
    )
    if "sqlite" in disk:
        sq = disk["sqlite"]
        text += f", SQLite {sq['service']['bytes_per_record']} B (old {sq['old_row_layout']['bytes_per_record']} B)"
    parts.append(text)
    for backend, r in s["read"].items():
        reads = [f"one step {r['one_step_http']['median_ms']:.0f} ms"]
        if "summaries" in r:
            reads.append(
                f"quantiles over {r['steps']} steps (summaries) {r['summaries']['median_ms']:.0f} ms"
            )
        reads.append(f"full read of {r['steps']} steps {r['full_read_quantiles']['median_ms']:.0f} ms")
        if "dashboard_panel" in r:
            p = r["dashboard_panel"]
            reads.append(f"dashboard panel {p['median_ms']:.0f} ms ({p['steps_covered']} steps)")
        parts.append(f"{backend} reads: " + ", ".join(reads))
    return "; ".join(parts)


def _concurrent(s: dict[str, Any]) -> str:
    st, lat, det, cpu = s["steps"], s["latency_client"], s["detector_per_step"], s["cpu_share_of_machine"]
    a = s["args"]
    text = (
        f"{a['runs']} runs x {a['rate']} step/s: offered {st['offered_steps_per_s']:.0f} steps/s, achieved "
        f"{st['achieved_steps_per_s']:.1f} ({'sustained' if st['sustained'] else 'backlog grows'}; median lag first/last third "
        f"{st['lag_s_median_first_third']}/{st['lag_s_median_last_third']} s); p50/p99 "
        + ", ".join(f"{kind} {v['p50_ms']}/{v['p99_ms']} ms" for kind, v in lat.items())
        + "; "
        f"detector {det['mean_ms']} ms mean per step (p99 <= {det['p99_le_ms']} ms); CPU server {cpu['server']:.0%}, "
        f"PostgreSQL {cpu['postgres']:.0%}, client {cpu['client']:.0%} of the machine"
    )
    per_step = s.get("cpu_ms_per_step")
    if per_step:
        text += (
            f" (CPU per step: server {per_step['server']} ms, PostgreSQL {per_step['postgres']} ms, "
            f"client {per_step['client']} ms)"
        )
    for t in s.get("trials", [])[1:]:
        text += (
            f"; confirm run {t['runs']} runs: achieved {t['achieved_steps_per_s']:.1f} steps/s, "
            f"{'sustained' if t['sustained'] else 'not sustained'}"
        )
    text += f"; max sustained measured: {s.get('max_sustained_steps_per_s')} steps/s"
    c = s["correctness"]
    return text + f"; rows stored == sent: {'yes' if c['ok'] else 'NO'}"


def _scale(s: dict[str, Any]) -> str:
    sm, c = s["summary"], s["correctness"]
    return (
        f"1 process {sm['single']['rows_per_s_median']:,} rows/s ({sm['single']['steps_per_s_median']} steps/s), "
        f"2 processes {sm['dual']['rows_per_s_median']:,} rows/s ({sm['dual']['steps_per_s_median']} steps/s) = "
        f"{sm['dual_vs_single']:.2f}x; no lost/duplicated rows: {'yes' if c['rows_ok'] else 'NO'}; phase events "
        f"identical to single process: {'yes' if c['phases_identical'] else 'NO'} ({c['phase_events_per_database']} events)"
    )


def _detection(s: dict[str, Any]) -> str:
    cost = s["cost_ms"]
    targets = "; ".join(
        f"{t['name']}: {t['value']} ({'met' if t['met'] else 'MISSED'})" for t in s["targets"]
    )
    return f"detector update median {cost['healthy_wall_median']:.2f} ms (p95 {cost['healthy_wall_p95']:.2f}); {targets}"


def _detector_pass(s: dict[str, Any]) -> str:
    off, on, ratio = s["modes"]["off"], s["modes"]["on"], s["off_over_on"]
    return (
        f"window {s['window_steps']} steps: cache off {off['wall_ms_median']:.1f} ms, on {on['wall_ms_median']:.1f} ms "
        f"median per pass = **{ratio['wall_ms_median']}x** (service CPU {ratio['service_cpu_ms_mean']}x, PostgreSQL "
        f"CPU {ratio['postgres_cpu_ms_mean']}x); same results: {'yes' if s['identical'] else 'NO'}"
    )


def _measure(s: dict[str, Any]) -> str:
    return (
        f"{s['responses']} x {s['tokens']} tokens: median {s['measure_step_ms_median']:.1f} ms, "
        f"x{s['speedup']:.0f} vs a naive loop ({s['threads']} threads)"
    )


def _hooks(s: dict[str, Any]) -> str:
    v = s["variants"]
    shares = ", ".join(f"{k} {x['hook_share']:.1%}" for k, x in v.items() if k != "plain")
    return f"hook code share of a step: {shares}; server down vs up {s['server_down_vs_up']:+.1%} step time"


def _dashboard(s: dict[str, Any]) -> str:
    r = s["results"]
    loads = [x["median_ms"] for k, x in r.items() if k.startswith("load:")]
    refresh = [r[k]["median_ms"] for k in ("refresh_idle", "refresh_10") if k in r]
    text = f"{s['steps']} steps: panel loads {min(loads):.0f}-{max(loads):.0f} ms median"
    if refresh:
        text += f", live refresh {min(refresh):.0f}-{max(refresh):.0f} ms"
    others = ", ".join(
        f"{k} {x['median_ms']:.0f} ms" for k, x in r.items() if not k.startswith(("load:", "refresh"))
    )
    return f"{text}, {others}"


def _history(s: dict[str, Any]) -> str:
    t, mib = s["median_ms"], s["file_mib"]
    return (
        f"{s['steps']:,} steps x {s['metrics']} metrics ({s['points']:,} points), median of {s['reps']}: "
        f"runs show {t['runs_show']:.0f} ms, export CSV {t['export_csv']:.0f} ms ({mib['csv']:.1f} MiB), "
        f"Parquet {t['export_parquet']:.0f} ms ({mib['parquet']:.1f} MiB), fetch_metrics over HTTP "
        f"{t['fetch_metrics']:.0f} ms"
    )


_DATABASES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def _importing(s: dict[str, Any]) -> str:
    p, a = s["parse"], s["args"]
    imports = ", ".join(
        f"{_DATABASES.get(label, label)} {x['steps_per_s']:,} steps/s ({x['values_per_s']:,} values/s)"
        for label, x in s["import"].items()
    )
    return (
        f"parse {p['file_mb']:.1f} MB verl JSONL ({p['steps']:,.0f} steps x {a['metrics']} metrics): {p['seconds']:.2f} s "
        f"= {p['mb_per_s']:.0f} MB/s, peak RSS +{p['rss_growth_mb']:.0f} MB over the idle process "
        f"({p['rss_growth_per_file_mb']:.2f}x the file); import {a['import_steps']:,} steps, {a['chunk_steps']} "
        f"per batch: {imports}"
    )


FIGURES: dict[str, Callable[[dict[str, Any]], str]] = {
    "ingest": _ingest,
    "actions": _actions,
    "concurrent_runs": _concurrent,
    "scale": _scale,
    "detection": _detection,
    "detector_pass": _detector_pass,
    "measure": _measure,
    "hooks": _hooks,
    "dashboard": _dashboard,
    "history": _history,
    "importing": _importing,
}


def figures(name: str, result: dict[str, Any]) -> str:
    if result["summary"] is None:
        return f"no results ({result['status']}; see {result['log']})"
    try:
        return FIGURES[name](result["summary"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return f"results not understood ({type(exc).__name__}: {exc})"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"Benchmarks {'(quick smoke run, not measurements) ' if results['quick'] else ''}run {results['date']} "
        f"at commit {results['git_commit']} on {m['cpus']} x {m['cpu_model']}, {m['memory_gib']} GiB; "
        f"load average {results['loadavg_before']} before, {results['loadavg_after']} after.",
        "",
        "| what | command | result | load before / after | status |",
        "|---|---|---|---|---|",
    ]
    for name, r in results["benchmarks"].items():
        cell = figures(name, r).replace("|", "/")
        lines.append(
            f"| {r['what']} | `{r['command']}` | {cell} | {r['loadavg_before'][0]} / {r['loadavg_after'][0]} | "
            f"{r['status']} ({r['duration_s']:.0f} s) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="minimal sizes: a smoke test, not a measurement")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(NAMES)}")
    parser.add_argument("--skip", help="comma-separated benchmarks to leave out")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="any database of the PostgreSQL server")
    args = parser.parse_args(argv)
    selected = list(NAMES)
    for flag, keep in (("only", True), ("skip", False)):
        value = getattr(args, flag)
        if value:
            names = [n.strip() for n in value.split(",") if n.strip()]
            unknown = [n for n in names if n not in NAMES]
            if unknown:
                parser.error(
                    f"--{flag}: unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(NAMES)}"
                )
            selected = [n for n in selected if (n in names) == keep]
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    results: dict[str, Any] = {
        "command": shlex.join(
            ["python", "-m", "benchmarks.run_all", *(argv if argv is not None else sys.argv[1:])]
        ),
        "quick": args.quick,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": machine(),
        "loadavg_before": loadavg(),
        "benchmarks": {},
    }
    for bench in BENCHES:
        if bench.name in selected:
            results["benchmarks"][bench.name] = run_one(bench, args)
    results["loadavg_after"] = loadavg()
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (args.out / "results.md").write_text(table)
    print()
    print(table)
    print(f"results: {args.out / 'results.json'}, {args.out / 'results.md'}")
    return 0 if all(r["status"] == "ok" for r in results["benchmarks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
