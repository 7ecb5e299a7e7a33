"""`lldmon lab`: the collapse label (against a naive loop and by hand), grid expansion, the summary's
aggregation on synthetic records, and `lldmon lab run --quick` end to end (with a resume)."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lldmon_lab.lab.grid import (
    PRESETS,
    REWARD_DESIGNS,
    GridError,
    GridSpec,
    Setting,
    expand,
    load_grid_file,
    parse_list,
    resolve_grid,
)
from lldmon_lab.lab.results import (
    TASK_SUCCESS,
    analyse,
    group_stats,
    label_metric,
    render_markdown,
    summary_payload,
)
from lldmon_lab.labels import (
    COLLAPSE,
    DAMAGED,
    HEALTHY,
    collapse_step,
    longest_shortfall,
    outcome,
    trailing_means,
)
from tests.timing import scaled

# ----------------------------------------------------------------------------------------------
# the collapse label


def naive_collapse_step(
    steps: Sequence[int],
    rewards: Sequence[float],
    window: int = 10,
    fraction: float = 0.2,
    min_peak: float = 0.05,
    min_after: int = 10,
) -> int | None:
    """The rule read literally: for each step, is every later trailing mean below fraction * peak?"""
    points: dict[int, float] = {}
    for s, r in zip(steps, rewards, strict=True):
        if math.isfinite(r):
            points[s] = r
    order = sorted(points)
    means = []
    for s in order:
        inside = [points[t] for t in order if s - window < t <= s]
        means.append(sum(inside) / len(inside))
    for i, s in enumerate(order):
        stays_down = all(means[j] < fraction * max(means[: j + 1]) for j in range(i, len(order)))
        if stays_down and max(means[: i + 1]) >= min_peak and order[-1] - s >= min_after:
            return s
    return None


rewards_st = st.one_of(
    st.floats(0.0, 1.0),
    st.sampled_from([0.0, 0.0, 0.05, 0.3, 0.5, math.nan]),
)


@st.composite
def reward_series(draw: st.DrawFn) -> tuple[list[int], list[float]]:
    n = draw(st.integers(0, 60))
    gaps = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    steps = [sum(gaps[: i + 1]) for i in range(n)]
    # piecewise levels make plateaus and drops; per-point noise on top
    levels = draw(st.lists(rewards_st, min_size=n, max_size=n))
    return steps, levels


@settings(max_examples=300, deadline=None)
@given(reward_series(), st.integers(1, 12), st.sampled_from([0.1, 0.2, 0.5]), st.integers(0, 15))
def test_label_matches_the_naive_loop(
    series: tuple[list[int], list[float]], window: int, fraction: float, min_after: int
) -> None:
    steps, rewards = series
    expected = naive_collapse_step(steps, rewards, window, fraction, 0.05, min_after)
    got = collapse_step(steps, rewards, window=window, fraction=fraction, min_peak=0.05, min_after=min_after)
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(reward_series())
def test_label_ignores_input_order_and_nan(series: tuple[list[int], list[float]]) -> None:
    steps, rewards = series
    pairs = list(zip(steps, rewards, strict=True))[::-1]
    assert collapse_step([s for s, _ in pairs], [r for _, r in pairs]) == collapse_step(steps, rewards)
    with_gaps = [math.nan if i % 7 == 3 else r for i, r in enumerate(rewards)]
    clean = [(s, r) for s, r in zip(steps, with_gaps, strict=True) if not math.isnan(r)]
    assert collapse_step(steps, with_gaps) == collapse_step([s for s, _ in clean], [r for _, r in clean])


def test_trailing_means_window_in_steps() -> None:
    steps, means = trailing_means([1, 5, 9, 13], [0.4, 0.2, 0.0, 0.0], window=10)
    assert steps == [1, 5, 9, 13]
    assert means == pytest.approx([0.4, 0.3, 0.2, 0.2 / 3])  # step 13 sees 5, 9, 13


def _steps(n: int) -> list[int]:
    return list(range(1, n + 1))


def test_healthy_run_has_no_label() -> None:
    rewards = [0.3 + 0.3 * i / 400 + (0.1 if i % 3 == 0 else -0.1) for i in range(400)]
    assert collapse_step(_steps(400), rewards) is None


def test_early_collapse() -> None:
    """Five good steps, then almost nothing: the 10-step mean drops under 20 % of the 0.3 peak once a
    single good step is left in the window (step 14: window 5..14)."""
    rewards = [0.3] * 5 + [0.01] * 95
    assert collapse_step(_steps(100), rewards) == 14


def test_late_collapse() -> None:
    good = [0.3 + 0.2 * i / 200 for i in range(200)]
    rewards = good + [0.0] * 200
    label = collapse_step(_steps(400), rewards)
    assert label is not None and 201 <= label <= 210


def test_noisy_recovery_is_not_a_collapse() -> None:
    """A 15-step dip to zero that recovers is not a collapse; a later dip that lasts is, at its start."""
    rewards = [0.4] * 50 + [0.0] * 15 + [0.4] * 50
    assert collapse_step(_steps(len(rewards)), rewards) is None
    rewards_then_die = rewards + [0.0] * 40
    label = collapse_step(_steps(len(rewards_then_die)), rewards_then_die)
    assert label is not None and label > 115


def test_no_label_without_a_peak_or_without_time_to_tell() -> None:
    assert collapse_step(_steps(100), [0.04] * 20 + [0.0] * 80) is None  # peak < 0.05
    assert collapse_step(_steps(100), [0.4] * 95 + [0.0] * 5) is None  # too short to tell
    assert collapse_step([], []) is None
    assert collapse_step(_steps(3), [math.nan] * 3) is None


def test_sparse_logging_every_fourth_step() -> None:
    """TRL logs the reward once per rollout batch (steps 1, 5, 9, ... with 4 steps per batch)."""
    steps = list(range(1, 400, 4))
    rewards = [0.4 if s < 150 else 0.0 for s in steps]
    # last good step 149; the window (151, 161] is the first with no good point left
    assert collapse_step(steps, rewards) == 161


def naive_longest_shortfall(
    steps: Sequence[int], rewards: Sequence[float], fraction: float, window: int = 10, min_peak: float = 0.05
) -> tuple[int | None, int]:
    """Every stretch of consecutive points below fraction * running peak, read literally; the longest."""
    s, m = trailing_means(steps, rewards, window)
    below = [m[i] < fraction * max(m[: i + 1]) and max(m[: i + 1]) >= min_peak for i in range(len(s))]
    best: tuple[int | None, int] = (None, 0)
    for i in range(len(s)):
        for j in range(i, len(s)):
            if not all(below[i : j + 1]):
                break
            if s[j] - s[i] + 1 > best[1]:
                best = (s[i], s[j] - s[i] + 1)
    return best


@settings(max_examples=300, deadline=None)
@given(reward_series(), st.sampled_from([0.2, 0.5, 0.8]), st.integers(1, 12))
def test_shortfall_matches_the_naive_loop(
    series: tuple[list[int], list[float]], fraction: float, window: int
) -> None:
    steps, rewards = series
    expected = naive_longest_shortfall(steps, rewards, fraction, window)
    assert longest_shortfall(steps, rewards, fraction=fraction, window=window) == expected


def test_outcome_three_ways() -> None:
    assert outcome(_steps(100), [0.3] * 30 + [0.0] * 70) == COLLAPSE
    # half of its success lost for 40 steps, then back: damaged, not healthy and not a collapse
    assert outcome(_steps(100), [0.3] * 20 + [0.1] * 40 + [0.3] * 40) == DAMAGED
    assert outcome(_steps(100), [0.3] * 20 + [0.1] * 15 + [0.3] * 65) == HEALTHY  # a dip of 15 + lag
    assert outcome(_steps(100), [0.04] * 20 + [0.0] * 80) == HEALTHY  # a peak below 0.05: nothing lost
    assert outcome([], []) == HEALTHY


def test_label_input_errors() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        collapse_step([1, 2], [0.1])
    with pytest.raises(ValueError, match="window"):
        trailing_means([1], [0.1], window=0)


# ----------------------------------------------------------------------------------------------
# the grid


def test_expand_crosses_axes_seed_major() -> None:
    spec = GridSpec(seeds=(0, 1), lr=(1e-3, 3e-4), llds=("off", "auto"), llds_lambda=(0.2,), steps=50)
    runs = expand(spec)
    assert len(runs) == 2 * 2 * 2
    assert [r.seed for r in runs] == [0, 0, 0, 0, 1, 1, 1, 1]  # every setting's seed 0 first
    assert len({r.key for r in runs}) == len(runs)
    off = [r for r in runs if r.setting.llds == "off"]
    assert all(r.setting.llds_lambda is None for r in off)  # lambda means nothing without LLDS
    assert all(r.setting.steps == 50 for r in runs)


def test_expand_drops_duplicates_and_unions_grids() -> None:
    same = GridSpec(llds=("off",), llds_lambda=(0.1, 0.2))  # lambdas collapse for off
    assert len(expand(same)) == 1
    a = GridSpec(seeds=(0, 1), lr=(1e-3,))
    b = GridSpec(seeds=(1, 2), lr=(1e-3, 3e-3))
    runs = expand([a, b])
    assert sorted((r.setting.lr, r.seed) for r in runs) == [
        (1e-3, 0),
        (1e-3, 1),
        (1e-3, 2),
        (3e-3, 1),
        (3e-3, 2),
    ]


def test_script_args_per_llds_mode() -> None:
    def args(setting: Setting) -> dict[str, str]:
        flags = setting.script_args()
        return dict(zip(flags[::2], flags[1::2], strict=True))

    off = args(Setting(llds="off", lr=1e-3, steps_per_generation=4))
    assert off["--llds"] == "off" and off["--policy"] == "alert" and "--llds-lambda" not in off
    assert off["--lr"] == "0.001" and off["--steps-per-generation"] == "4"
    on = args(Setting(llds="on", llds_lambda=0.2))
    assert on["--llds"] == "on" and on["--llds-lambda"] == "0.2" and on["--policy"] == "alert"
    auto = args(Setting(llds="auto"))
    assert auto["--llds"] == "auto" and auto["--policy"] == "auto" and "--lr" not in auto
    assert "--num-iterations" not in auto
    assert args(Setting(num_iterations=2))["--num-iterations"] == "2"
    assert args(Setting(llds="auto", policy="alert"))["--policy"] == "alert"


def test_reward_design_and_beta_in_keys_only_when_not_default() -> None:
    default = Setting(lr=1e-3, steps_per_generation=4, steps=80)
    # the key of every committed fixture (tests/fixtures/lab) is still what it was
    assert default.key == "tiny_lr0.001_spg4_g4_len96_llds-off_n80"
    assert Setting(lr=1e-3, steps_per_generation=4, steps=80, reward_design="exact", beta=0.0) == default
    flags = default.script_args()
    assert "--reward-design" not in flags and "--beta" not in flags  # the default command, as before
    centred = Setting(lr=1e-3, steps_per_generation=4, steps=80, reward_design="centred", beta=0.04)
    assert centred.key == "tiny_lr0.001_spg4_g4_len96_rw-centred_beta0.04_llds-off_n80"
    args = dict(zip(centred.script_args()[::2], centred.script_args()[1::2], strict=True))
    assert args["--reward-design"] == "centred" and args["--beta"] == "0.04"
    g8 = Setting(num_generations=8, reward_design="penalty")
    assert "_g8_" in g8.key and "rw-penalty" in g8.key and "beta" not in g8.key
    assert centred.as_dict()["reward_design"] == "centred" and centred.as_dict()["beta"] == 0.04
    spec = GridSpec(reward_design=REWARD_DESIGNS, beta=(None, 0.0, 0.04), num_generations=(4, 8))
    runs = expand(spec)
    assert len(runs) == len(REWARD_DESIGNS) * 2 * 2  # beta 0 is the default: one setting, one key
    assert len({r.key for r in runs}) == len(runs)
    specs = resolve_grid(None, [], {"reward_design": ["composite", "success"], "beta": [0.1]})
    assert {(r.setting.reward_design, r.setting.beta) for r in expand(specs)} == {
        ("composite", 0.1),
        ("success", 0.1),
    }
    with pytest.raises(GridError, match="reward_design"):
        resolve_grid(None, [], {"reward_design": ["dense"]})
    with pytest.raises(GridError, match="reward_design"):
        resolve_grid(None, [], {"reward_design": ["default"]})
    with pytest.raises(GridError, match="beta"):
        Setting(beta=-0.1)


def test_label_series_per_reward_design() -> None:
    """Runs of a design other than `exact` are labelled on the task's success where it was logged."""
    assert label_metric(None) == label_metric({}) == label_metric({"reward_design": "exact"}) == "reward/mean"
    assert label_metric({"reward_design": "centred"}) == TASK_SUCCESS
    assert label_metric({"reward_design": "centred"}, available=["reward/mean"]) == "reward/mean"
    # a centred reward of a collapsing task: signed, near 0; the task success says what happened
    success = [0.3] * 20 + [0.0] * 40
    baseline, centred = None, []
    for value in success:
        baseline = value if baseline is None else 0.9 * baseline + 0.1 * value
        centred.append(value - baseline)
    record = _record("c", "g", 0, centred)
    record["setting"] = {"steps": 60, "llds": "off", "reward_design": "centred"}
    record["task_success"] = {"steps": list(range(1, 61)), "values": success}
    d = analyse(record)
    assert d.collapse_step == collapse_step(range(1, 61), success) is not None
    assert d.best_reward == pytest.approx(0.3) and d.final_reward == 0.0
    assert analyse({**record, "task_success": {"steps": [], "values": []}}).collapse_step == collapse_step(
        range(1, 61), centred
    )
    exact = {**record, "setting": {"steps": 60, "llds": "off"}}
    assert analyse(exact).collapse_step == collapse_step(range(1, 61), centred)  # exact: reward/mean


def test_presets_and_layering(tmp_path: Path) -> None:
    for name in PRESETS:
        assert expand(resolve_grid(name)), name
    quick = expand(resolve_grid("quick"))
    assert len(quick) == 2 and {r.setting.llds for r in quick} == {"off", "auto"}
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'steps = 30\nseeds = [3, 4]\n[[grids]]\nlr = [1e-3]\n[[grids]]\nlr = ["default"]\nllds = ["on"]\n'
    )
    specs = resolve_grid("late", load_grid_file(grid), {"seeds": [9]})
    runs = expand(specs)
    assert {r.seed for r in runs} == {9}  # the command line wins over the file and the preset
    assert {r.setting.steps for r in runs} == {30}  # the file wins over the preset
    assert {(r.setting.lr, r.setting.llds) for r in runs} >= {(1e-3, "off"), (None, "on")}
    as_json = tmp_path / "grid.json"
    as_json.write_text(json.dumps({"num_generations": [4, 8], "max_completion_length": 64}))
    assert {r.setting.num_generations for r in expand(resolve_grid(None, load_grid_file(as_json)))} == {4, 8}


def test_grid_errors(tmp_path: Path) -> None:
    assert parse_list("1e-3, default", float) == [1e-3, None]
    with pytest.raises(GridError, match="not a valid float"):
        parse_list("fast", float)
    with pytest.raises(GridError, match="unknown grid key"):
        resolve_grid(None, [{"learning_rate": [1e-3]}])
    with pytest.raises(GridError, match="llds"):
        resolve_grid(None, [], {"llds": ["sometimes"]})
    with pytest.raises(GridError, match="unknown preset"):
        resolve_grid("nope")
    bad = tmp_path / "bad.toml"
    bad.write_text("seeds = [")
    with pytest.raises(GridError, match=r"bad\.toml"):
        load_grid_file(bad)


# ----------------------------------------------------------------------------------------------
# records and the summary


def _record(
    key: str,
    group: str,
    seed: int,
    rewards: list[float],
    *,
    status: str = "finished",
    alerts: list[dict[str, Any]] | None = None,
    phases: list[dict[str, Any]] | None = None,
    directives: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    steps = list(range(1, len(rewards) + 1))
    return {
        "key": key,
        "group": group,
        "seed": seed,
        "setting": {"steps": len(rewards), "llds": "off"},
        "run_name": key,
        "run_id": seed + 1,
        "status": status,
        "run": {"last_step": len(rewards), "phase": "healthy"},
        "reward": {"steps": steps, "values": rewards},
        "alerts": alerts or [],
        "phases": phases or [],
        "directives": directives or [],
    }


def test_analyse_a_run() -> None:
    record = _record(
        "a",
        "g",
        0,
        [0.3] * 5 + [0.01] * 95,
        alerts=[{"kind": "lld_decay", "severity": "warning", "first_step": 9}],
        phases=[{"step": 12, "phase": "decay"}, {"step": 30, "phase": "collapse"}],
        directives=[{"step": 10, "enabled": True}, {"step": None, "enabled": False}],
    )
    d = analyse(record)
    assert d.collapse_step == 14 and d.first_alert == 9 and d.first_alert_kind == "lld_decay"
    assert d.first_decay == 12 and d.first_collapse_phase == 30 and d.first_directive == 10
    assert d.first_warning == 9 and d.lead_time == 5
    assert d.best_reward == pytest.approx(0.3) and d.final_reward == pytest.approx(0.01)
    assert d.steps_done == 100


def test_a_diagnosis_is_no_warning_of_a_collapse() -> None:
    """Records of services that sent `advantage_collapse` as a warning (every late-lab run at step 86):
    it does not count as the first warning, a collapse warning or a critical alert does."""
    diagnosis = {"kind": "advantage_collapse", "severity": "warning", "first_step": 86}
    stalled = {"kind": "run_stalled", "severity": "warning", "first_step": 50}
    decline = {"kind": "reward_decline", "severity": "warning", "first_step": 250}
    crash = {"kind": "heal_exhausted", "severity": "critical", "first_step": 290}
    rewards = [0.3] * 280 + [0.01] * 120
    d = analyse(_record("a", "g", 0, rewards, alerts=[diagnosis, stalled]))
    assert d.first_alert is None and d.lead_time is None
    d = analyse(_record("a", "g", 0, rewards, alerts=[diagnosis, stalled, crash, decline]))
    assert (d.first_alert, d.first_alert_kind) == (250, "reward_decline") and d.collapse_step is not None
    assert d.lead_time == d.collapse_step - 250
    assert analyse(_record("a", "g", 0, rewards, alerts=[diagnosis, crash])).first_alert == 290


def test_group_stats_and_rendering() -> None:
    collapse = [0.3] * 5 + [0.01] * 95
    healthy = [0.3] * 100
    records = [
        _record("g1_s0", "g1", 0, collapse, phases=[{"step": 10, "phase": "decay"}]),
        _record("g1_s1", "g1", 1, healthy),
        _record("g1_s2", "g1", 2, [0.3] * 40 + [0.0] * 60),  # no warning: no lead time
        _record("g1_s3", "g1", 3, collapse, status="failed"),  # not counted
        _record("g2_s0", "g2", 0, healthy),
    ]
    g1, g2 = group_stats(records)
    assert (g1.group, g1.runs, g1.finished, g1.collapsed) == ("g1", 4, 3, 2)
    assert g1.collapse_rate == pytest.approx(2 / 3)
    assert g1.collapse_steps == (14, 49) and g1.median_collapse_step == pytest.approx(31.5)
    assert g1.lead_times == (4,) and g1.median_lead_time == 4 and g1.warned_before == 1
    assert g1.seeds == (0, 1, 2, 3)
    assert (g2.collapsed, g2.collapse_rate, g2.median_collapse_step) == (0, 0.0, None)
    payload = summary_payload(records, {"command": "lldmon lab run --quick"})
    json.dumps(payload, allow_nan=False)  # strict JSON
    assert [r["key"] for r in payload["runs"]] == [r["key"] for r in records]
    md = render_markdown(payload)
    assert "| g1 | 0 1 2 3 | 3/4 | 2 | 67% | 31.500 | 14 49 | 4 | 1/2 |" in md
    assert md.count("\n| g1_s") == 4 and "lldmon lab run --quick" in md


# ----------------------------------------------------------------------------------------------
# end to end: lldmon lab run --quick, then a resume

TRAINING_PACKAGES = ("torch", "transformers", "trl", "datasets", "bm25s")


def _lab(out: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LLDMON_DATABASE_URL", None)
    env.pop("LLDMON_TOKEN", None)
    return subprocess.run(
        [exe, "lab", "run", "--quick", "--out", str(out), "--jobs", "2", "--poll-seconds", "0.5"],
        capture_output=True,
        text=True,
        timeout=scaled(240),  # about 20 s on 2 idle cores (2 runs: 30 warm-up + 6 GRPO steps each)
        env=env,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_quick_lab_end_to_end_and_resume(tmp_path: Path) -> None:
    missing = [name for name in TRAINING_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the lab's training needs {', '.join(missing)} (pip install -e '.[hooks]')")
    out = tmp_path / "lab"
    started = time.monotonic()
    first = _lab(out)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    assert time.monotonic() - started < 180

    summary = json.loads((out / "summary.json").read_text())
    expected = {r.key for r in expand(resolve_grid("quick"))}
    assert {r["key"] for r in summary["runs"]} == expected and len(summary["runs"]) == 2
    assert all(r["status"] == "finished" and r["steps_done"] == 6 for r in summary["runs"])
    assert len(summary["groups"]) == 2 and "rule" in summary
    md = (out / "summary.md").read_text()
    assert all(key in md for key in expected)

    # the service got the runs' metrics (read back through the service layer; the lab has exited)
    from contracts import metrics as M
    from monitor.api.app import build_state
    from monitor.config import Settings
    from monitor.domain import Principal, RunFilter

    def lab_runs() -> dict[str, Any]:
        state = build_state(Settings(data_dir=out / "lldmon"))
        try:
            who = Principal()
            runs = state.runs.list(who, RunFilter(project="lab"))
            return {
                r.name: (r, {s.name: s for s in state.query.history(who, r.id, None)}, r.directive_policy)
                for r in runs
            }
        finally:
            state.db.dispose()

    runs = lab_runs()
    assert set(runs) == expected
    for name, (run, series, policy) in runs.items():
        assert run.status == "finished"
        assert series[M.GRAD_NORM].steps == [1, 2, 3, 4, 5, 6]
        assert M.REWARD_MEAN in series
        assert policy == ("auto" if "llds-auto" in name else "alert")
    record = json.loads(next((out / "runs").glob("*llds-off*.json")).read_text())
    assert record["reward"]["steps"] == runs[record["run_name"]][1][M.REWARD_MEAN].steps

    # a rerun skips finished runs and starts nothing
    second = _lab(out)
    assert second.returncode == 0, second.stdout[-3000:]
    assert "2 finished runs found" in second.stdout and "0 runs finished, 2 skipped" in second.stdout
    assert set(lab_runs()) == expected

    # an unfinished run (its record gone, as after a crash) is started again under a new name
    off_record = next((out / "runs").glob("*llds-off*.json"))
    off_key = json.loads(off_record.read_text())["key"]
    off_record.unlink()
    third = _lab(out)
    assert third.returncode == 0, third.stdout[-6000:]
    assert "1 runs finished, 1 skipped" in third.stdout
    assert set(lab_runs()) == expected | {f"{off_key}-r2"}
    rows = {r["key"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}
    assert rows[off_key]["run_name"] == f"{off_key}-r2" and len(rows) == 2


# ----------------------------------------------------------------------------------------------
# the runner against a fake training script (no torch): records, labels, failures, resume

FAKE_SCRIPT = """
import argparse, json, sys, uuid
import httpx

p = argparse.ArgumentParser()
for flag in ("--lldmon-url", "--project", "--run-name", "--policy", "--output-dir", "--summary-json"):
    p.add_argument(flag)
p.add_argument("--seed", type=int)
p.add_argument("--steps", type=int)
p.add_argument("--reward-design", default="exact")
args, _ = p.parse_known_args()
if args.seed == 13:
    print("model: broken on purpose", flush=True)
    sys.exit(3)
api = args.lldmon_url + "/api/v1"
run = httpx.post(api + "/runs", json={"name": args.run_name, "project": args.project}).json()
httpx.put(f"{api}/runs/{run['id']}/policy", json={"policy": args.policy}).raise_for_status()
steps = list(range(1, args.steps + 1))
rewards = [0.4 if s < args.steps // 2 else 0.0 for s in steps] if args.seed == 1 else [0.4] * len(steps)
metrics = {"reward/mean": rewards, "rewards/exact_match/mean": rewards}
if args.reward_design == "centred":  # the task collapses; the logged reward is signed, near 0
    metrics["reward/mean"] = [(-0.01 if s % 2 else 0.01) for s in steps]
body = {"batch_id": uuid.uuid4().hex, "steps": steps, "metrics": metrics}
httpx.post(f"{api}/runs/{run['id']}/metrics", json=body).raise_for_status()
httpx.post(f"{api}/runs/{run['id']}/finish", json={"status": "finished"}).raise_for_status()
print("SUMMARY " + json.dumps({"status": "finished", "steps": args.steps}), flush=True)
"""


def test_runner_with_a_fake_script(tmp_path: Path) -> None:
    from rich.console import Console

    from lldmon_lab.lab.runner import LabError, LabOptions, run_lab

    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_SCRIPT)
    out = tmp_path / "lab"
    runs = expand(GridSpec(seeds=(0, 1, 13), steps=60, llds=("off",)))
    console = Console(file=io.StringIO(), width=200)
    options = LabOptions(out=out, runs=runs, jobs=2, script=script, poll_seconds=0.2)
    report = run_lab(options, console)
    assert report.exit_code == 1 and len(report.ran) == 2 and len(report.failed) == 1
    rows = {r["seed"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}
    assert rows[13]["status"] == "failed" and rows[13]["returncode"] == 3 and rows[13]["run_id"] is None
    assert rows[0]["status"] == "finished" and rows[0]["collapse_step"] is None
    steps = list(range(1, 61))
    expected = collapse_step(steps, [0.4 if s < 30 else 0.0 for s in steps])
    assert expected is not None and rows[1]["collapse_step"] == expected
    assert rows[1]["steps_done"] == 60 and rows[1]["best_reward"] == pytest.approx(0.4)
    assert rows[1]["final_reward"] == 0.0
    (group,) = json.loads((out / "summary.json").read_text())["groups"]
    assert (group["finished"], group["collapsed"], group["collapse_rate"]) == (2, 1, 0.5)

    # resume: the finished runs are skipped, the failed one is tried again
    again = run_lab(options, console)
    assert sorted(again.skipped) == sorted(r.key for r in runs if r.seed != 13)
    assert again.failed == [r.key for r in runs if r.seed == 13]
    # it never registered a run, so its name is free again: the same log, appended to
    assert (out / "logs" / f"{again.failed[0]}.log").read_text().count("broken on purpose") == 2

    # a centred run is labelled on the task success the script logged, not on its signed reward
    centred = expand(GridSpec(seeds=(1,), steps=60, reward_design=("centred",)))
    centred_out = tmp_path / "lab-centred"
    assert run_lab(LabOptions(out=centred_out, runs=centred, script=script, poll_seconds=0.2), console).ran
    (row,) = json.loads((centred_out / "summary.json").read_text())["runs"]
    assert "rw-centred" in row["key"] and row["collapse_step"] == expected
    (record,) = (centred_out / "runs").glob("*.json")
    assert json.loads(record.read_text())["task_success"]["values"][0] == 0.4

    # a grid that needs a flag the script lacks stops before starting anything
    with pytest.raises(LabError, match="num-iterations"):
        run_lab(
            LabOptions(out=tmp_path / "lab2", runs=expand(GridSpec(num_iterations=(2,))), script=script),
            console,
        )
