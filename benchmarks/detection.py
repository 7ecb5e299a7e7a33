"""Detection quality and cost of `monitor.detector` on generated scenarios, recorded lab runs and the
real logs, scored per source.

Runs the evaluation harness (`lldmon_lab.evaluation`) on `--collapse` generated collapse runs and
`--controls` healthy + `--controls` noisy-stagnant runs, each with and without the hook metrics, the
recorded collapse-lab runs in tests/fixtures/lab (`lldmon_lab.lab.fixtures`), and the real third-party
logs in ../shared/datasets/real_runs with their labels (`--labels`, default the packaged
lldmon_lab/eval_labels/real_runs.toml; skipped with a message if that folder is absent); prints the
per-run, per-source and per-group tables, the targets per source (critical finding in time, early warning,
no critical finding on controls) and the runs that miss them. Then measures the detector's cost:
the median (and p95) time of one `update()` call that processes one new point with a window of
`required_history` points, over a `--cost-steps`-step run (a long healthy run with hook metrics) and over
the collapse runs (where every signal is computed).

Usage::

    python -m benchmarks.detection [--collapse 20] [--controls 10] [--seed 0] [--jobs 2]
                                   [--cost-steps 10000] [--no-real] [--labels FILE] [--no-lab] [--quiet]
                                   [--json PATH] [--scale-free] [--undeclared] [--harder]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from contracts import metrics as M
from lldmon_lab.eval_harder import Budget, budgets, judge, render_budgets
from lldmon_lab.evaluation import (
    SOURCE_LAB,
    EvaluationReport,
    LabelledRun,
    RunReport,
    evaluate,
    found_runs,
    labelled_runs,
    render,
    report_of,
)
from lldmon_lab.lab.fixtures import load_fixtures
from lldmon_lab.labels import collapse_step
from lldmon_lab.replay import thin
from lldmon_lab.run_labels import DEFAULT_LABELS
from lldmon_lab.scenarios import Scenario, collapse_scenario, healthy_scenario, scenario_suite
from monitor.detector import DetectorConfig, DetectorState, SeriesWindow, update

REAL_RUNS_DIR = Path(__file__).resolve().parents[1].parent / "shared/datasets/real_runs"
LAB_FIXTURES_DIR = Path(__file__).resolve().parents[1] / "tests/fixtures/lab"


def _evaluate_one(run: LabelledRun, scale_free: bool = False) -> list[RunReport]:
    return evaluate([run], scale_free=scale_free).runs


def reward_design(run: RunReport) -> str:
    """The lab reward design of a recorded run, from its group name (`..._rw-<design>_...`; none: exact)."""
    match = re.search(r"_rw-([a-z]+)_", run.group)
    return match.group(1) if match else "exact"


def render_designs(report: EvaluationReport) -> str:
    """The lab's three targets per reward design (`--reward-design` of the collapse lab)."""
    rows: dict[str, list[RunReport]] = {}
    for r in report.runs:
        if r.source == SOURCE_LAB:
            rows.setdefault(reward_design(r), []).append(r)
    lines = [
        "per lab reward design: critical by label + 5 | warning >= 20 ahead (countable) | false critical on controls"
        " | damaged runs with a critical",
    ]
    for design, runs in sorted(rows.items()):
        collapsing = [r for r in runs if r.collapses]
        countable = [r for r in collapsing if r.early_countable]
        controls = [r for r in runs if r.control]
        damaged = [r for r in runs if r.damaged]
        lines.append(
            f"  {design:<10} {sum(r.critical_in_time for r in collapsing)}/{len(collapsing)} | "
            f"{sum(r.warned_early for r in countable)}/{len(countable)} | "
            f"{sum(r.first_critical is not None for r in controls)}/{len(controls)} | "
            f"{sum(r.first_critical is not None for r in damaged)}/{len(damaged)}"
        )
    return "\n".join(lines)


def _undeclared(run: LabelledRun) -> LabelledRun:
    """`run` as a user who declared nothing would have it judged: `reward/mean` and its own range."""
    return dataclasses.replace(run, reward_metric=None, reward_floor=None)


def run_evaluation(runs: list[LabelledRun], jobs: int, scale_free: bool = False) -> EvaluationReport:
    one = functools.partial(_evaluate_one, scale_free=scale_free)
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            reports = [r for rs in pool.map(one, runs, chunksize=2) for r in rs]
    else:
        reports = [r for run in runs for r in one(run)]
    return report_of(reports)


def run_budgets(runs: list[LabelledRun], jobs: int, scale_free: bool = False) -> list[Budget]:
    """The false-critical budget of the controls (`lldmon_lab.eval_harder`)."""
    controls = [r for r in runs if r.control]
    one = functools.partial(judge, scale_free=scale_free)
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            judged = list(pool.map(one, controls))
    else:
        judged = [one(r) for r in controls]
    return budgets(controls, judged)


def update_cost_ms(scenario: Scenario, config: DetectorConfig) -> tuple[list[float], list[float]]:
    """Wall and CPU time (ms) of each `update()` call that adds one point to a window of
    `required_history` points (CPU time is what a busy machine's scheduler cannot inflate)."""
    full = SeriesWindow.from_columns(scenario.steps, scenario.values, scenario.present)
    horizon = config.required_history
    state: DetectorState | None = None
    times: list[float] = []
    cpu: list[float] = []
    for i in range(len(full)):
        lo = max(0, i - horizon + 1)
        window = SeriesWindow(
            steps=full.steps[lo : i + 1],
            values={k: v[lo : i + 1] for k, v in full.values.items()},
            present={k: v[lo : i + 1] for k, v in full.present.items()},
        )
        c0 = time.process_time()
        t0 = time.perf_counter()
        state = update(window, state, config).state
        times.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return times, cpu


def _thinned(run: LabelledRun, every: int) -> LabelledRun:
    """`run` as a trainer that logs every `every` steps would have sent it; its label is kept."""
    steps, values, present = thin(run.steps, run.values, run.present, every)
    label = run.collapse_step
    if label is None and run.collapses:
        label = collapse_step(run.steps, run.values.get(M.REWARD_MEAN, np.full(run.steps.size, np.nan)))
    return dataclasses.replace(run, steps=steps, values=values, present=present, collapse_step=label)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--collapse", type=int, default=20, help="generated collapse runs")
    parser.add_argument("--controls", type=int, default=10, help="healthy and noisy-stagnant runs each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--cost-steps", type=int, default=10_000)
    parser.add_argument("--no-real", action="store_true", help="leave out the real logs")
    parser.add_argument(
        "--labels", type=Path, default=DEFAULT_LABELS, help="labels file of the real logs (TOML)"
    )
    parser.add_argument("--no-lab", action="store_true", help="leave out the recorded lab runs")
    parser.add_argument("--quiet", action="store_true", help="no per-run table")
    parser.add_argument(
        "--thin",
        type=int,
        default=1,
        help="replay every run as a trainer logging every N steps would have sent it (labels unchanged)",
    )
    parser.add_argument("--json", type=Path, help="write the group summaries, targets and costs here")
    parser.add_argument(
        "--scale-free", action="store_true", help="judge every run without its declared reward floor"
    )
    parser.add_argument(
        "--undeclared",
        action="store_true",
        help="judge every run on reward/mean in its own range: no declared reward series or floor",
    )
    parser.add_argument(
        "--harder",
        action="store_true",
        help="also the false-critical budget: controls in other reward units, shuffled in blocks, thinned",
    )
    args = parser.parse_args(argv)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    config = DetectorConfig()

    runs = [LabelledRun.from_scenario(s) for s in scenario_suite(args.collapse, args.controls, args.seed)]
    if not args.no_lab:
        lab = load_fixtures(LAB_FIXTURES_DIR) if LAB_FIXTURES_DIR.is_dir() else []
        print(f"lab runs: {len(lab)} recorded runs from {LAB_FIXTURES_DIR}")
        runs += lab
    if args.no_real:
        pass
    elif REAL_RUNS_DIR.is_dir():
        real = labelled_runs(args.labels, REAL_RUNS_DIR)
        collapsing = sum(r.collapses for r in real.runs)
        print(
            f"real logs: {len(real.runs)} runs ({collapsing} collapsing) from {REAL_RUNS_DIR}, "
            f"labels {args.labels}"
        )
        if real.missing:
            print(f"real logs: skipped (files missing): {', '.join(m.name for m in real.missing)}")
        runs += real.runs
    else:
        print(f"real logs: {REAL_RUNS_DIR} not found, skipped")
    if not args.no_real:
        found = found_runs()
        print(f"real logs: {len(found)} licensed runs from tests/fixtures/third_party (found_runs.toml)")
        runs += found
    if args.undeclared:
        runs = [_undeclared(r) for r in runs]
        print("undeclared: every run judged on reward/mean without a declared reward series or floor")
    if args.thin > 1:
        runs = [_thinned(r, args.thin) for r in runs]
        print(f"every run thinned to its last value per {args.thin}-step block (lldmon_lab/replay.py)")
    t0 = time.perf_counter()
    report = run_evaluation(runs, args.jobs, args.scale_free)
    elapsed = time.perf_counter() - t0
    print()
    if args.scale_free:
        print("scale-free: every run judged without a declared reward floor")
    print(render(report, per_run=not args.quiet))
    if not args.no_lab:
        print("\n" + render_designs(report))
    print(f"\nevaluated {len(runs)} runs in {elapsed:.1f} s with {args.jobs} process(es)")
    budget: list[Budget] = []
    if args.harder:
        budget = run_budgets(runs, args.jobs, args.scale_free)
        print("\n" + render_budgets(budget))

    print(
        f"\ndetector cost per update() call (one new point, window = required_history = {config.required_history}):"
    )
    long_run = healthy_scenario(args.seed, n_steps=args.cost_steps)
    times, cpu = update_cost_ms(long_run, config)
    print(
        f"  {args.cost_steps}-step healthy run with hooks: wall median {statistics.median(times):.2f} ms "
        f"(p95 {_pct(times, 0.95):.2f}), CPU median {statistics.median(cpu):.2f} ms (p95 {_pct(cpu, 0.95):.2f})"
        "  (target <= 5 ms)"
    )
    c_times: list[float] = []
    c_cpu: list[float] = []
    for seed in range(args.seed, args.seed + 5):
        wall, proc = update_cost_ms(collapse_scenario(seed), config)
        c_times += wall
        c_cpu += proc
    print(
        f"  5 collapse runs with hooks ({len(c_times)} calls): wall median {statistics.median(c_times):.2f} ms "
        f"(p95 {_pct(c_times, 0.95):.2f}), CPU median {statistics.median(c_cpu):.2f} ms (p95 {_pct(c_cpu, 0.95):.2f})"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"  (1-minute load average during the run: {load:.1f} on {os.cpu_count()} CPUs)")
    met = report.all_met and statistics.median(times) <= 5.0  # every source's targets
    per_source = ", ".join(
        f"{s.source} {'NO' if report.missed([s.source]) else 'yes'}" for s in report.sources
    )
    print(f"\ntargets met per source: {per_source}")
    print(f"all targets met: {'yes' if met else 'NO'}")
    if args.json:
        summary = {
            "command": shlex.join([sys.executable, *sys.argv]),
            "runs": len(runs),
            "sources": [dataclasses.asdict(s) for s in report.sources],
            "groups": [dataclasses.asdict(g) for g in report.groups],
            "targets": [dataclasses.asdict(t) for t in report.targets],
            "cost_ms": {
                "healthy_wall_median": statistics.median(times),
                "healthy_wall_p95": _pct(times, 0.95),
                "healthy_cpu_median": statistics.median(cpu),
                "collapse_wall_median": statistics.median(c_times),
                "collapse_wall_p95": _pct(c_times, 0.95),
            },
            "cost_steps": args.cost_steps,
            "loadavg": load,
            "all_met": met,
            "scale_free": args.scale_free,
            "budget": [dataclasses.asdict(b) | {"per_10k": b.per_10k} for b in budget],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
