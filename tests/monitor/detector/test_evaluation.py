"""Evaluation harness, the issue's targets on a fixed-seed scenario set, and the real logs."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from contracts import metrics as M
from lldmon_lab.evaluation import (
    DELAY_TARGET,
    LEAD_TARGET,
    SOURCE_GENERATED,
    SOURCE_LAB,
    SOURCE_THIRD_PARTY,
    TARGET_CONTROLS,
    TARGET_CRITICAL,
    LabelledRun,
    check_targets,
    evaluate,
    real_runs,
    render,
)
from lldmon_lab.scenarios import collapse_scenario, healthy_scenario, noisy_stagnant_scenario, scenario_suite
from monitor.detector import ADVANTAGE_COLLAPSE, TRAINING_COLLAPSE, DetectorConfig

REAL = Path(__file__).resolve().parents[3].parent / "shared/datasets/real_runs"
FIRST_BATCH = (
    "verl-gsm8k-qwen2.5-0.5b-ppo",
    "verl-gsm8k-gemma-2-2b-ppo",
    "searchr1-grpo-qwen2.5-3b",
    "searchr1-gigpo-qwen2.5-3b",
    "trl-finqa-qwen2.5-7b-grpo",
)


def test_scores_a_collapse_and_a_false_alarm() -> None:
    s = collapse_scenario(11)
    crashing_control = LabelledRun(
        name="control-that-crashes",
        group="control",
        steps=s.steps,
        values=s.without_hooks().values,
        collapses=False,
    )
    report = evaluate([LabelledRun.from_scenario(s), crashing_control])
    hooked, control = report.runs
    assert hooked.collapse_step == s.collapse_step and not hooked.degraded
    assert hooked.first_alert is not None and s.collapse_step is not None
    assert hooked.lead_time == s.collapse_step - hooked.first_alert
    assert hooked.detection_delay == hooked.first_collapse - s.collapse_step  # type: ignore[operator]
    assert hooked.caught_before_crash and not hooked.false_alarm
    assert control.degraded and control.false_alarm and TRAINING_COLLAPSE in control.critical_kinds
    text = render(report)
    assert "control-that-crashes" in text and TARGET_CONTROLS in text and "NO" in text
    assert not report.all_met


def test_warnings_on_controls_are_counted_per_kind() -> None:
    """A warning most healthy runs get is noise: the report counts, per source and kind, the controls that
    got each warning (once per run however often it came back)."""
    s = collapse_scenario(11)
    flagged = [replace(LabelledRun.from_scenario(noisy_stagnant_scenario(i)), name=f"c{i}") for i in range(3)]
    report = evaluate([LabelledRun.from_scenario(s), *flagged])
    (gen,) = report.sources
    controls = [r for r in report.runs if not r.collapses]
    warned = Counter(k for r in controls for k in set(r.warning_kinds))
    diagnosed = Counter(k for r in controls for k in set(r.info_kinds))
    assert diagnosed[ADVANTAGE_COLLAPSE] == 3  # stagnant by construction: the diagnosis, not a warning
    assert dict(gen.warnings_on_controls) == dict(warned) and dict(gen.info_on_controls) == dict(diagnosed)
    for per_kind in (gen.warnings_on_controls, gen.info_on_controls):
        counts = [n for _, n in per_kind]
        assert counts == sorted(counts, reverse=True) and all(n <= 3 for n in counts)
    text = render(report, per_run=False).splitlines()
    line = next(x for x in text if x.startswith("  generated (3 controls)"))
    assert all(f"{k} {n}" in line for k, n in (*gen.warnings_on_controls, *gen.info_on_controls))
    assert f"info: {ADVANTAGE_COLLAPSE} 3" in line


def test_label_is_computed_when_missing() -> None:
    s = collapse_scenario(12)
    run = LabelledRun("unlabelled", "x", s.steps, s.values, collapses=True, present=s.present)
    (report,) = evaluate([run]).runs
    assert report.collapse_step == s.collapse_step


def test_scores_and_targets_per_source() -> None:
    """Each source gets its own summary row and its own targets: a good score on generated runs cannot
    hide a bad one elsewhere."""
    s = collapse_scenario(11)
    generated = LabelledRun.from_scenario(s)
    late = LabelledRun(  # a "lab" collapse labelled at 5, long before the reward drop the detector sees
        name="lab-late",
        group="lab-g",
        steps=np.arange(60),
        values={M.REWARD_MEAN: np.r_[np.full(20, 0.3), np.zeros(40)], M.GRAD_NORM: np.full(60, 0.5)},
        collapses=True,
        collapse_step=5,
        source=SOURCE_LAB,
    )
    control = LabelledRun.from_scenario(healthy_scenario(3))
    third = LabelledRun(
        "third", "real", control.steps, control.values, collapses=False, source=SOURCE_THIRD_PARTY
    )
    report = evaluate([generated, late, control, third])
    assert [x.source for x in report.sources] == [SOURCE_GENERATED, SOURCE_LAB, SOURCE_THIRD_PARTY]
    gen, lab, tp = report.sources
    assert (gen.runs, gen.collapsing, gen.caught_before_crash, gen.controls, gen.false_alarms) == (
        2,
        1,
        1,
        1,
        0,
    )
    late_report = report.runs[1]
    assert late_report.first_alert is not None and late_report.first_alert > 5  # the reward crash at 20
    assert (lab.runs, lab.collapsing, lab.caught_before_crash, lab.controls) == (1, 1, 0, 0)
    assert lab.lead_median == late_report.lead_time == 5 - late_report.first_alert
    unlabelled = evaluate([replace(late, collapse_step=None)]).runs[0]
    assert unlabelled.collapse_step == 28  # the one rule: 10-step mean < 20 % of its peak from 28 on
    assert (tp.runs, tp.controls, tp.false_alarms) == (1, 1, 0)
    lab_targets = {t.name: t for t in report.targets if t.source == SOURCE_LAB}
    assert not lab_targets[TARGET_CRITICAL].met  # labelled at 5: a critical finding was due by step 15
    assert lab_targets[TARGET_CRITICAL].offending[0].startswith("lab-late (label 5, deadline 15")
    assert SOURCE_LAB in {t.source for t in report.missed()}
    assert report.missed([SOURCE_THIRD_PARTY]) == []
    text = render(report, per_run=False)
    assert "score per source" in text
    assert "warnings on controls" in text and "  lab (0 controls): none" in text
    assert [line.split()[0] for line in text.splitlines() if line.split()[:1] in (["lab"], ["third-party"])]


def test_targets_without_runs_of_a_kind() -> None:
    h = healthy_scenario(3)
    report = evaluate([LabelledRun.from_scenario(h)])
    assert [t.name for t in report.targets] == [TARGET_CONTROLS]
    assert report.all_met and check_targets([]) == []


def test_targets_on_a_fixed_seed_scenario_set() -> None:
    """The issue's targets on 20 runs: 6 collapse runs and 2 + 2 controls, each with and without hooks."""
    runs = [LabelledRun.from_scenario(s) for s in scenario_suite(n_collapse=6, n_controls=2, seed=2024)]
    assert len(runs) == 20
    report = evaluate(runs, DetectorConfig())
    hooked = [r for r in report.runs if r.collapses and not r.degraded]
    degraded = [r for r in report.runs if r.collapses and r.degraded]
    controls = [r for r in report.runs if not r.collapses]
    assert all(r.caught_before_crash for r in hooked)
    assert float(np.median([r.lead_time for r in hooked])) >= LEAD_TARGET
    assert all(r.detection_delay is not None and r.detection_delay <= DELAY_TARGET for r in degraded)
    assert not [r.name for r in controls if r.false_alarm]
    assert report.all_met, render(report)


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/datasets/real_runs is missing")
def test_real_logs_raise_no_collapse() -> None:
    """The first batch of real logs (healthy controls) raises no critical finding."""
    runs = [r for r in real_runs(REAL) if r.name in FIRST_BATCH]
    assert len(runs) == 5 and not any(r.collapses for r in runs)
    report = evaluate(runs)
    for r in report.runs:
        assert r.degraded  # imported logs have no likelihood metrics
        assert r.first_collapse is None and not r.critical_kinds, (r.name, r.critical_kinds)
    by_name = {r.name: r for r in report.runs}
    # 50-70 % zero-std groups for 2400 steps: the advantage-collapse warning is wanted there
    assert ADVANTAGE_COLLAPSE in by_name["trl-finqa-qwen2.5-7b-grpo"].info_kinds
    gsm8k = next(r for r in runs if r.name == "verl-gsm8k-qwen2.5-0.5b-ppo")
    assert gsm8k.values[M.GRAD_NORM][16] > 60  # the isolated spike that must not count
