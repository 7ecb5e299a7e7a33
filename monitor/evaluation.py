"""Evaluation harness: run `detect_offline` over labelled runs and score it, per source of runs.

Sources: "generated" (`monitor.detector.scenarios`, written here to the detector's idea of the phases),
"lab" (recorded runs of the collapse lab, `monitor.lab.fixtures`: real GRPO runs, every hook metric)
and "third-party" (real trainer logs of others, `real_runs`: all healthy controls, no hook metrics).
A score over all sources together would let the generated runs hide the others, so every summary and
every target is per source.

Per run, per source and per group of runs:
- the label: `monitor.detector.labels.collapse_step` (the one collapse rule: the first step after
  which the reward's 10-step trailing mean stays below 20 % of its running peak until the end);
- lead time: steps from the first decay / collapse finding to the labelled collapse; positive =
  warned before it;
- detection delay: steps from the labelled collapse to the first `lld_collapse` finding (<= 0: before);
- first finding of any kind (warning or critical) and whether it came before the labelled collapse;
- false alarms on runs that do not collapse: an `lld_collapse` finding or any critical terminal flag.
Pure apart from reading log files through `monitor.importers` (`real_runs`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from contracts import metrics as M
from monitor.detector import (
    LLD_COLLAPSE,
    LLD_DECAY,
    SEVERITY,
    DetectorConfig,
    OfflineResult,
    detect_offline,
)
from monitor.detector.labels import collapse_step
from monitor.detector.scenarios import Scenario
from monitor.importers import ParsedLog, load_trl_stdout, load_verl_console

SOURCE_GENERATED = "generated"
SOURCE_LAB = "lab"
SOURCE_THIRD_PARTY = "third-party"
SOURCES = (SOURCE_GENERATED, SOURCE_LAB, SOURCE_THIRD_PARTY)
"""Where labelled runs come from, in report order (module docstring)."""

LEAD_TARGET = 40
"""Median lead time (steps) wanted on collapse runs with hook metrics."""
DELAY_TARGET = 5
"""Largest detection delay (steps after the reward collapse) wanted without hook metrics."""


@dataclass(frozen=True)
class LabelledRun:
    name: str
    group: str
    steps: npt.NDArray[np.int64]
    values: Mapping[str, npt.NDArray[np.float64]]
    collapses: bool
    """Ground truth: does this run collapse? Controls (False) are scored for false alarms."""
    present: Mapping[str, npt.NDArray[np.bool_]] | None = None
    collapse_step: int | None = None
    """Labelled collapse step; computed from `reward/mean` with `labels.collapse_step` when None and
    `collapses`."""
    source: str = SOURCE_GENERATED
    """generated, lab or third-party (`SOURCES`)."""

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> LabelledRun:
        group = f"{scenario.kind}{'+hooks' if scenario.hooks else '-degraded'}"
        return cls(
            name=scenario.name,
            group=group,
            steps=scenario.steps,
            values=scenario.values,
            present=scenario.present,
            collapses=scenario.collapses,
            collapse_step=scenario.collapse_step,
            source=SOURCE_GENERATED,
        )

    @classmethod
    def from_log(
        cls,
        name: str,
        log: ParsedLog,
        group: str = "real",
        collapses: bool = False,
        source: str = SOURCE_THIRD_PARTY,
    ) -> LabelledRun:
        return cls(
            name=name,
            group=group,
            steps=log.steps,
            values=log.values,
            present=log.present,
            collapses=collapses,
            source=source,
        )


@dataclass(frozen=True)
class RunReport:
    name: str
    group: str
    n_steps: int
    degraded: bool
    collapses: bool
    collapse_step: int | None
    first_alert: int | None
    """First step with an `lld_decay` or `lld_collapse` finding."""
    first_collapse: int | None
    lead_time: int | None
    """collapse_step - first_alert (None without a collapse or without an alert)."""
    detection_delay: int | None
    """first_collapse - collapse_step."""
    critical_kinds: tuple[str, ...]
    warning_kinds: tuple[str, ...]
    phase_path: tuple[str, ...]
    """Phases in order of entry."""
    source: str = SOURCE_GENERATED
    first_finding: int | None = None
    """First step with any warning or critical finding."""
    first_finding_kind: str | None = None

    @property
    def caught_before_crash(self) -> bool:
        return self.lead_time is not None and self.lead_time > 0

    @property
    def any_finding_before_crash(self) -> bool:
        """Any warning or critical finding strictly before the labelled collapse."""
        return (
            self.collapse_step is not None
            and self.first_finding is not None
            and self.first_finding < self.collapse_step
        )

    @property
    def false_alarm(self) -> bool:
        """A control run with a collapse finding or a critical terminal flag."""
        return not self.collapses and bool(self.critical_kinds)


@dataclass(frozen=True)
class GroupSummary:
    group: str
    runs: int
    collapsing: int
    caught_before_crash: int
    lead_median: float | None
    lead_min: int | None
    delay_median: float | None
    delay_max: int | None
    missed: int
    """Collapsing runs without any lld_collapse finding."""
    false_alarms: int
    decay_warnings_on_controls: int
    warning_kinds: tuple[str, ...]


@dataclass(frozen=True)
class SourceSummary:
    """The score on one source of runs (module docstring)."""

    source: str
    runs: int
    collapsing: int
    caught_before_crash: int
    """Collapsing runs with a decay/collapse finding strictly before the labelled collapse."""
    any_finding_before_crash: int
    """Collapsing runs with any warning or critical finding strictly before the labelled collapse."""
    lead_median: float | None
    lead_min: int | None
    lead_max: int | None
    delay_median: float | None
    missed: int
    """Collapsing runs without any lld_collapse finding."""
    no_alert: int
    """Collapsing runs without any decay/collapse finding at all."""
    controls: int
    false_alarms: int
    decay_warnings_on_controls: int


@dataclass(frozen=True)
class TargetCheck:
    name: str
    value: str
    target: str
    met: bool
    source: str = "all"


@dataclass(frozen=True)
class EvaluationReport:
    runs: list[RunReport]
    groups: list[GroupSummary] = field(default_factory=list)
    targets: list[TargetCheck] = field(default_factory=list)
    sources: list[SourceSummary] = field(default_factory=list)

    @property
    def all_met(self) -> bool:
        return all(t.met for t in self.targets)

    def missed(self, sources: Iterable[str] | None = None) -> list[TargetCheck]:
        """Targets not met, on `sources` only (None: every source)."""
        keep = None if sources is None else set(sources)
        return [t for t in self.targets if not t.met and (keep is None or t.source in keep)]


def score_run(run: LabelledRun, result: OfflineResult) -> RunReport:
    label = run.collapse_step
    if label is None and run.collapses:
        label = collapse_step(run.steps, run.values.get(M.REWARD_MEAN, np.full(run.steps.size, np.nan)))
    first_alert = result.first(LLD_DECAY, LLD_COLLAPSE)
    flagged = sorted((f.first_step, f.kind) for f in result.findings if f.severity in ("warning", "critical"))
    first_collapse = result.first(LLD_COLLAPSE)
    lead = None if label is None or first_alert is None else label - first_alert
    delay = None if label is None or first_collapse is None else first_collapse - label
    critical = sorted({f.kind for f in result.findings if SEVERITY.get(f.kind) == "critical"})
    warnings = sorted({f.kind for f in result.findings if SEVERITY.get(f.kind) == "warning"})
    path = tuple(c.phase for c in result.phase_changes)
    return RunReport(
        name=run.name,
        group=run.group,
        n_steps=int(run.steps.size),
        degraded=result.degraded,
        collapses=run.collapses,
        collapse_step=label,
        first_alert=first_alert,
        first_collapse=first_collapse,
        lead_time=lead,
        detection_delay=delay,
        critical_kinds=tuple(critical),
        warning_kinds=tuple(warnings),
        phase_path=path,
        source=run.source,
        first_finding=flagged[0][0] if flagged else None,
        first_finding_kind=flagged[0][1] if flagged else None,
    )


def summarise(group: str, reports: Sequence[RunReport]) -> GroupSummary:
    collapsing = [r for r in reports if r.collapses]
    leads = [r.lead_time for r in collapsing if r.lead_time is not None]
    delays = [r.detection_delay for r in collapsing if r.detection_delay is not None]
    controls = [r for r in reports if not r.collapses]
    return GroupSummary(
        group=group,
        runs=len(reports),
        collapsing=len(collapsing),
        caught_before_crash=sum(r.caught_before_crash for r in collapsing),
        lead_median=float(statistics.median(leads)) if leads else None,
        lead_min=min(leads) if leads else None,
        delay_median=float(statistics.median(delays)) if delays else None,
        delay_max=max(delays) if delays else None,
        missed=sum(r.first_collapse is None for r in collapsing),
        false_alarms=sum(r.false_alarm for r in controls),
        decay_warnings_on_controls=sum(LLD_DECAY in r.warning_kinds for r in controls),
        warning_kinds=tuple(sorted({k for r in reports for k in r.warning_kinds})),
    )


def summarise_source(source: str, reports: Sequence[RunReport]) -> SourceSummary:
    collapsing = [r for r in reports if r.collapses]
    leads = [r.lead_time for r in collapsing if r.lead_time is not None]
    delays = [r.detection_delay for r in collapsing if r.detection_delay is not None]
    controls = [r for r in reports if not r.collapses]
    return SourceSummary(
        source=source,
        runs=len(reports),
        collapsing=len(collapsing),
        caught_before_crash=sum(r.caught_before_crash for r in collapsing),
        any_finding_before_crash=sum(r.any_finding_before_crash for r in collapsing),
        lead_median=float(statistics.median(leads)) if leads else None,
        lead_min=min(leads) if leads else None,
        lead_max=max(leads) if leads else None,
        delay_median=float(statistics.median(delays)) if delays else None,
        missed=sum(r.first_collapse is None for r in collapsing),
        no_alert=sum(r.first_alert is None for r in collapsing),
        controls=len(controls),
        false_alarms=sum(r.false_alarm for r in controls),
        decay_warnings_on_controls=sum(LLD_DECAY in r.warning_kinds for r in controls),
    )


def by_source(reports: Sequence[RunReport]) -> dict[str, list[RunReport]]:
    """Reports per source, in `SOURCES` order (unknown sources after them, in order of appearance)."""
    out: dict[str, list[RunReport]] = {s: [] for s in SOURCES}
    for r in reports:
        out.setdefault(r.source, []).append(r)
    return {s: rs for s, rs in out.items() if rs}


def source_targets(reports: Sequence[RunReport]) -> list[TargetCheck]:
    """`check_targets` on each source separately (every check names its source)."""
    return [t for s, rs in by_source(reports).items() for t in check_targets(rs, source=s)]


def check_targets(reports: Sequence[RunReport], source: str = "all") -> list[TargetCheck]:
    """The issue's targets over whatever runs are present."""
    checks: list[TargetCheck] = []
    hooked = [r for r in reports if r.collapses and not r.degraded]
    if hooked:
        leads = [r.lead_time if r.lead_time is not None else -(10**6) for r in hooked]
        med = statistics.median(leads)  # a run without an alert counts as the worst lead
        caught = sum(r.caught_before_crash for r in hooked)
        silent = sum(r.lead_time is None for r in hooked)
        checks.append(
            TargetCheck(
                "median lead time, collapse runs with hooks",
                (f"{med:g}" if med > -(10**6) else "none")
                + (f" ({silent}/{len(hooked)} without an alert)" if silent else ""),
                f">= {LEAD_TARGET}",
                med >= LEAD_TARGET,
                source,
            )
        )
        checks.append(
            TargetCheck(
                "caught before the reward collapse, with hooks",
                f"{caught}/{len(hooked)}",
                "all",
                caught == len(hooked),
                source,
            )
        )
    degraded = [r for r in reports if r.collapses and r.degraded]
    if degraded:
        ok = [r.detection_delay is not None and r.detection_delay <= DELAY_TARGET for r in degraded]
        worst = max((r.detection_delay for r in degraded if r.detection_delay is not None), default=None)
        checks.append(
            TargetCheck(
                "collapse finding <= 5 steps after the reward collapse, without hooks",
                f"{sum(ok)}/{len(degraded)} (worst {worst})",
                "all",
                all(ok),
                source,
            )
        )
    controls = [r for r in reports if not r.collapses]
    if controls:
        bad = [r.name for r in controls if r.false_alarm]
        checks.append(
            TargetCheck(
                "collapse findings / critical flags on controls",
                f"{len(bad)}/{len(controls)}" + (f" ({', '.join(bad[:5])})" if bad else ""),
                "0",
                not bad,
                source,
            )
        )
    return checks


def evaluate(runs: Iterable[LabelledRun], config: DetectorConfig | None = None) -> EvaluationReport:
    cfg = DetectorConfig() if config is None else config
    return report_of(
        [score_run(run, detect_offline(run.steps, run.values, cfg, run.present)) for run in runs]
    )


def report_of(reports: list[RunReport]) -> EvaluationReport:
    """Groups, per-source summaries and per-source targets of scored runs."""
    groups: dict[str, list[RunReport]] = {}
    for r in reports:
        groups.setdefault(r.group, []).append(r)
    return EvaluationReport(
        runs=reports,
        groups=[summarise(g, rs) for g, rs in groups.items()],
        targets=source_targets(reports),
        sources=[summarise_source(s, rs) for s, rs in by_source(reports).items()],
    )


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return lines


def render(report: EvaluationReport, per_run: bool = True) -> str:
    """The report as plain-text tables: per run (optional), per source, per group, targets per source."""
    lines: list[str] = []
    if per_run:
        lines += _table(
            [
                "run",
                "source",
                "group",
                "steps",
                "mode",
                "crash",
                "alert",
                "collapse",
                "lead",
                "delay",
                "first finding",
                "critical",
                "warnings",
            ],
            [
                [
                    r.name,
                    r.source,
                    r.group,
                    r.n_steps,
                    "degraded" if r.degraded else "hooks",
                    r.collapse_step,
                    r.first_alert,
                    r.first_collapse,
                    r.lead_time,
                    r.detection_delay,
                    None if r.first_finding is None else f"{r.first_finding} ({r.first_finding_kind})",
                    ",".join(r.critical_kinds) or "-",
                    ",".join(r.warning_kinds) or "-",
                ]
                for r in report.runs
            ],
        )
        lines.append("")
    lines.append("score per source (crash: labelled collapse, monitor/detector/labels.py; alert: first")
    lines.append("lld_decay/lld_collapse finding; lead = crash - alert, > 0 caught before the collapse):")
    lines += _table(
        [
            "source",
            "runs",
            "collapsing",
            "caught<crash",
            "any finding<crash",
            "lead med",
            "lead min",
            "lead max",
            "delay med",
            "no alert",
            "missed",
            "controls",
            "false alarms",
            "decay warn (controls)",
        ],
        [
            [
                s.source,
                s.runs,
                s.collapsing,
                f"{s.caught_before_crash}/{s.collapsing}",
                f"{s.any_finding_before_crash}/{s.collapsing}",
                s.lead_median,
                s.lead_min,
                s.lead_max,
                s.delay_median,
                s.no_alert,
                s.missed,
                s.controls,
                s.false_alarms,
                s.decay_warnings_on_controls,
            ]
            for s in report.sources
        ],
    )
    lines.append("")
    source_of_group = {r.group: r.source for r in report.runs}
    lines += _table(
        [
            "group",
            "source",
            "runs",
            "collapsing",
            "caught<crash",
            "lead med",
            "lead min",
            "delay med",
            "delay max",
            "missed",
            "false alarms",
            "decay warn (controls)",
            "warnings",
        ],
        [
            [
                g.group,
                source_of_group.get(g.group),
                g.runs,
                g.collapsing,
                g.caught_before_crash,
                g.lead_median,
                g.lead_min,
                g.delay_median,
                g.delay_max,
                g.missed,
                g.false_alarms,
                g.decay_warnings_on_controls,
                ",".join(g.warning_kinds) or "-",
            ]
            for g in report.groups
        ],
    )
    lines.append("")
    lines += _table(
        ["source", "target", "value", "wanted", "met"],
        [[t.source, t.name, t.value, t.target, "yes" if t.met else "NO"] for t in report.targets],
    )
    return "\n".join(lines)


REAL_RUNS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "verl-gsm8k-qwen2.5-0.5b-ppo",
        "verl",
        ("verl_data_gsm8k_ppo/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log",),
    ),
    (
        "verl-gsm8k-gemma-2-2b-ppo",
        "verl",
        ("verl_data_gsm8k_ppo/gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log",),
    ),
    (
        "searchr1-grpo-qwen2.5-3b",
        "verl",
        (
            "wallace_searchr1_grpo_gigpo/grpo__train_v2.pre_resume_step100.log",
            "wallace_searchr1_grpo_gigpo/grpo__train_v2_resume_from100.log",
        ),
    ),
    (
        "searchr1-gigpo-qwen2.5-3b",
        "verl",
        (
            "wallace_searchr1_grpo_gigpo/gigpo__train_300_gigpo.pre_resume_step100.log",
            "wallace_searchr1_grpo_gigpo/gigpo__train_300_gigpo_resume_from100.log",
        ),
    ),
    ("trl-finqa-qwen2.5-7b-grpo", "trl", ("wallace_finqa_trl_grpo/train_stage7_grpo_long2400_r32.log",)),
)
"""The real third-party logs (../shared/datasets/real_runs/README.md): none of them collapses."""


def real_runs(root: Path) -> list[LabelledRun]:
    """The real logs under `root` (missing files are skipped), labelled by the one collapse rule (none of
    the five collapses by it: they are controls), source "third-party"."""
    out: list[LabelledRun] = []
    for name, fmt, files in REAL_RUNS:
        paths = [root / f for f in files]
        if not all(p.is_file() for p in paths):
            continue
        log = load_verl_console(paths) if fmt == "verl" else load_trl_stdout(paths)
        label = collapse_step(log.steps, log.values.get(M.REWARD_MEAN, np.full(log.steps.size, np.nan)))
        run = LabelledRun.from_log(name, log, group="real", collapses=label is not None)
        out.append(replace(run, collapse_step=label))
    return out
