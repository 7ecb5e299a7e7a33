"""`lldmon eval`'s three targets, scored on hand-made detector results (no dependence on the detector's
current quality): a critical finding in time on collapsing runs, an early warning on runs with hook
metrics, no critical finding on controls; severities come from `monitor.detector.SEVERITY` at run time."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from typer.testing import CliRunner

import lldmon_lab.evaluation as evaluation
from contracts import metrics as M
from lldmon_lab.evaluation import (
    SOURCE_GENERATED,
    SOURCE_LAB,
    SOURCE_THIRD_PARTY,
    TARGET_CONTROLS,
    TARGET_CRITICAL,
    TARGET_EARLY,
    EvaluationReport,
    LabelledRun,
    check_targets,
    critical_deadline,
    render,
    report_of,
    score_run,
)
from monitor.cli import app
from monitor.detector import SEVERITY, DetectorState, FindingSpan, OfflineResult
from monitor.importers import ParsedLog

CRITICAL = next(kind for kind, severity in SEVERITY.items() if severity == "critical")
WARNING = next(kind for kind, severity in SEVERITY.items() if severity == "warning")


def result(steps: np.ndarray, findings: Sequence[tuple[str, int]], degraded: bool = True) -> OfflineResult:
    """Findings (kind, first step); a span's own severity is SEVERITY's now, "info" for an unknown kind."""
    spans = [
        FindingSpan(kind, str(SEVERITY.get(kind, "info")), first, first + 1, kind, {})
        for kind, first in findings
    ]
    return OfflineResult(
        steps=steps,
        phases=np.full(steps.size, "healthy"),
        phase_changes=[],
        findings=sorted(spans, key=lambda s: (s.first_step, s.kind)),
        state=DetectorState(),
        degraded=degraded,
    )


def run(
    name: str,
    *,
    label: int | None = None,
    hooks: bool = False,
    n: int = 100,
    source: str = SOURCE_THIRD_PARTY,
) -> LabelledRun:
    steps = np.arange(n, dtype=np.int64)
    values = {M.REWARD_MEAN: np.full(n, 0.5)}
    if hooks:
        values[M.LOGP_POS] = np.linspace(-1.0, -3.0, n)
    return LabelledRun(
        name=name,
        group="g",
        steps=steps,
        values=values,
        collapses=label is not None,
        collapse_step=label,
        source=source,
    )


def scored(r: LabelledRun, *findings: tuple[str, int]) -> evaluation.RunReport:
    return score_run(r, result(r.steps, findings, degraded=not r.values.keys() & {M.LOGP_POS}))


def test_deadline() -> None:
    assert [critical_deadline(s) for s in (0, 8, 10, 11, 50)] == [15, 15, 15, 16, 55]


@pytest.mark.parametrize(
    ("label", "critical_at", "met"),
    [
        (50, 55, True),  # 5 steps after the label
        (50, 56, False),
        (50, 3, True),  # before the label counts too
        (8, 15, True),  # labelled <= 10: by step 15
        (8, 16, False),
        (11, 16, True),
        (11, 17, False),
    ],
)
def test_target_1_critical_in_time(label: int, critical_at: int, met: bool) -> None:
    report = scored(run("c", label=label), (WARNING, 1), (CRITICAL, critical_at))
    assert report.first_critical == critical_at and report.first_critical_kind == CRITICAL
    assert report.critical_in_time is met
    (check,) = [t for t in check_targets([report]) if t.name == TARGET_CRITICAL]
    assert check.met is met and check.value == f"{int(met)}/1"
    if not met:
        assert check.offending == (
            f"c (label {label}, deadline {critical_deadline(label)}, first critical {critical_at} ({CRITICAL}))",
        )


def test_target_1_a_warning_is_not_enough_and_no_finding_misses() -> None:
    warned = scored(run("w", label=30), (WARNING, 10))
    silent = scored(run("s", label=30))
    assert not warned.critical_in_time and not silent.critical_in_time
    (check,) = check_targets([warned, silent])
    assert check.name == TARGET_CRITICAL and not check.met and check.value == "0/2"
    assert check.offending[1] == "s (label 30, deadline 35, first critical none)"


def test_target_2_early_warning_only_counts_runs_with_hooks_labelled_late_enough() -> None:
    on_time = scored(run("on-time", label=50, hooks=True), (WARNING, 30), (CRITICAL, 52))
    late = scored(run("late", label=50, hooks=True), (WARNING, 31), (CRITICAL, 52))
    early_label = scored(run("early-label", label=15, hooks=True), (CRITICAL, 12))  # not countable
    # labelled at 29: the warning would be due at step 9, before 10 steps of history (not countable)
    assert not scored(run("short-history", label=29, hooks=True), (WARNING, 5)).early_countable
    assert scored(run("enough-history", label=30, hooks=True), (WARNING, 10)).warned_early
    no_hooks = scored(run("no-hooks", label=50), (CRITICAL, 50))  # target 2 does not apply
    assert on_time.has_hooks and not no_hooks.has_hooks
    assert on_time.warned_early and not late.warned_early
    assert not early_label.early_countable and not no_hooks.early_countable
    checks = {t.name: t for t in check_targets([on_time, late, early_label, no_hooks])}
    early = checks[TARGET_EARLY]
    assert not early.met and early.value == "1/2 countable (1 of 3 labelled before step 30)"
    assert early.offending == (f"late (label 50, first warning 31 ({WARNING}))",)
    assert checks[TARGET_CRITICAL].met  # every run had its critical finding in time
    only_early_labels = check_targets([early_label])
    assert [t.name for t in only_early_labels] == [TARGET_CRITICAL, TARGET_EARLY]
    assert only_early_labels[1].met and only_early_labels[1].value.startswith("0/0 countable")


def test_hook_metrics_need_a_logged_value() -> None:
    r = run("never-logged", label=50)
    empty = LabelledRun(
        r.name,
        r.group,
        r.steps,
        {**r.values, M.LOGP_POS: np.full(r.steps.size, np.nan)},
        True,
        collapse_step=50,
    )
    assert not scored(empty).has_hooks
    present = {M.REWARD_MEAN: np.ones(r.steps.size, bool), M.LOGP_POS: np.r_[True, np.zeros(99, bool)]}
    logged_nan = LabelledRun(
        r.name, r.group, r.steps, empty.values, True, present=present, collapse_step=50
    )  # a logged NaN is a logged value
    assert scored(logged_nan).has_hooks


def test_target_3_no_critical_finding_on_controls() -> None:
    quiet = scored(run("quiet"), (WARNING, 5))  # a warning on a control is allowed
    noisy = scored(run("noisy"), (WARNING, 5), (CRITICAL, 40))
    assert not quiet.false_alarm and noisy.false_alarm
    (check,) = check_targets([quiet, noisy])
    assert check.name == TARGET_CONTROLS and check.value == "1/2" and not check.met
    assert check.offending == (f"noisy (first critical 40 ({CRITICAL}); {CRITICAL})",)


def test_a_damaged_run_is_neither_a_collapse_nor_a_control() -> None:
    """A run whose success fell below half its peak for 30+ steps and crawled back above the collapse
    line: a critical finding on it is no false alarm, and none is owed; the report counts it apart."""
    n = 100
    success = np.r_[np.full(20, 0.3), np.full(40, 0.1), np.full(40, 0.3)]  # half of its peak for 40 steps
    assert evaluation.is_damaged(False, np.arange(n), success)
    assert not evaluation.is_damaged(True, np.arange(n), success)  # a collapse stays a collapse
    brief = np.r_[np.full(20, 0.3), np.full(15, 0.1), np.full(65, 0.3)]  # a dip shorter than 30 steps
    assert not evaluation.is_damaged(False, np.arange(n), brief)
    damaged = LabelledRun.from_log(
        "damaged",
        ParsedLog(
            steps=np.arange(n, dtype=np.int64),
            values={M.REWARD_MEAN: success},
            present={M.REWARD_MEAN: np.ones(n, dtype=np.bool_)},
        ),
    )
    assert damaged.damaged and not damaged.control and not damaged.collapses
    paged = scored(damaged, (CRITICAL, 30))
    assert paged.label == "damaged" and not paged.false_alarm and paged.deadline is None
    quiet = scored(run("quiet"))
    assert quiet.label == "healthy" and quiet.control
    (check,) = check_targets([paged, quiet])
    assert check.name == TARGET_CONTROLS and check.value == "0/1" and check.met
    report = report_of([paged, quiet])
    (summary,) = report.sources
    assert (summary.controls, summary.damaged, summary.damaged_with_critical, summary.false_alarms) == (
        1,
        1,
        1,
        0,
    )
    text = render(report, per_run=False)
    assert f"damaged (first critical 30 ({CRITICAL}))" in text


def test_severity_comes_from_severity_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind the detector adds later counts with the severity SEVERITY gives it."""
    kind = "kind_added_later"
    assert kind not in SEVERITY
    r = run("new-kind", label=50)
    before = scored(r, (kind, 52))
    assert before.first_critical is None  # unknown to SEVERITY: the span's own severity ("info")
    monkeypatch.setitem(SEVERITY, kind, "critical")
    after = scored(r, (kind, 52))
    assert after.first_critical == 52 and after.critical_in_time and after.critical_kinds == (kind,)
    stale = result(r.steps, [(kind, 52)])  # spans that say "critical" ...
    monkeypatch.setitem(SEVERITY, kind, "warning")
    assert score_run(r, stale).first_critical is None  # ... are judged by what SEVERITY says now
    warned = scored(r, (kind, 52))
    assert warned.first_finding == 52 and not warned.critical_kinds and warned.warning_kinds == (kind,)


def per_source_report() -> EvaluationReport:
    return report_of(
        [
            scored(
                run("gen-ok", label=60, hooks=True, source=SOURCE_GENERATED), (WARNING, 20), (CRITICAL, 61)
            ),
            scored(run("gen-control", source=SOURCE_GENERATED)),
            scored(run("lab-missed", label=12, source=SOURCE_LAB), (CRITICAL, 30)),
            scored(run("tp-collapse", label=11), (CRITICAL, 3)),
            scored(run("tp-control"), (CRITICAL, 90)),
        ]
    )


def test_per_source_summary_render_and_missed() -> None:
    report = per_source_report()
    gen, lab, tp = report.sources
    assert (
        gen.source,
        gen.critical_in_time,
        gen.hooked_collapsing,
        gen.early_countable,
        gen.warned_early,
    ) == (
        SOURCE_GENERATED,
        1,
        1,
        1,
        1,
    )
    assert (lab.critical_in_time, lab.collapsing) == (0, 1)
    assert (tp.critical_in_time, tp.collapsing, tp.controls, tp.false_alarms) == (1, 1, 1, 1)
    assert {t.source for t in report.missed()} == {SOURCE_LAB, SOURCE_THIRD_PARTY}
    assert report.missed([SOURCE_GENERATED]) == []
    text = render(report, per_run=True)
    assert "critical<=deadline" in text and "warn>=20 before" in text
    assert f"[{SOURCE_LAB}] {TARGET_CRITICAL}: missed by\n  lab-missed (label 12, deadline 17" in text
    assert f"[{SOURCE_THIRD_PARTY}] {TARGET_CONTROLS}: missed by\n  tp-control (first critical 90" in text


runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ([], 0),  # only printed
        (["--gate", SOURCE_GENERATED], 0),  # generated meets all three
        (["--gate", SOURCE_THIRD_PARTY], 1),  # a gate implies --check
        (["--check", "--gate", f"{SOURCE_GENERATED},{SOURCE_LAB}"], 1),
        (["--check"], 1),  # default gate: generated,third-party
        (["--gate", "nonsense"], 2),
    ],
)
def test_eval_gate_fails_on_a_missed_target(
    monkeypatch: pytest.MonkeyPatch, args: list[str], code: int
) -> None:
    monkeypatch.setattr(
        evaluation, "evaluate", lambda runs, config=None, scale_free=False: per_source_report()
    )
    result = runner.invoke(
        app, ["eval", "--collapse", "0", "--controls", "0", "--no-lab", *args], env={"COLUMNS": "240"}
    )
    assert result.exit_code == code, result.output
    if code == 1:
        assert "missed, gated:" in result.output
