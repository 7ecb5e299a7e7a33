"""Evaluation harness: run `detect_offline` over labelled runs and score it, per source of runs.

Sources: "generated" (`lldmon_lab.scenarios`, written here to the detector's idea of the phases),
"lab" (recorded runs of the collapse lab, `lldmon_lab.lab.fixtures`: real GRPO runs, every hook metric)
and "third-party" (real trainer logs of others, labelled in a labels file, `lldmon_lab.run_labels`: the repo's
`DEFAULT_LABELS` list every log in ../shared/datasets/real_runs, collapses and controls, without hook
metrics). A score over all sources together would let the generated runs hide the others, so every summary
and every target is per source.

Per run, per source and per group of runs:
- the label: given (scenarios, lab fixtures, labels file) or `lldmon_lab.labels.collapse_step` (the
  one collapse rule: the first step after which the reward's 10-step trailing mean stays below 20 % of its
  running peak until the end); a run that does not collapse is a control only when it is not damaged
  (`lldmon_lab.labels.longest_shortfall`: its trailing mean below half its running peak for 30
  steps or more). A damaged run owes no critical finding and a critical finding on it is no false alarm;
  the report counts them apart;
- lead time: steps from the first decay / collapse finding to the labelled collapse; positive =
  warned before it;
- detection delay: steps from the labelled collapse to the first `lld_collapse` finding (<= 0: before);
- first finding of any kind (warning or critical) and whether it came before the labelled collapse;
- first critical finding.

The targets, per source (`check_targets`); a finding's severity is `monitor.detector.SEVERITY[kind]` looked
up at run time (any kind the detector has, today's or a new one):
1. every collapsing run has a critical finding by its labelled collapse step + `CRITICAL_WITHIN` (5; before
   the label counts too), or by step `EARLY_DEADLINE` (15) for a run labelled at step <= `EARLY_LABEL` (10);
2. every collapsing run with hook likelihood metrics (`lld/*` columns) has a warning or critical finding at
   least `WARNING_LEAD` (20) steps before its labelled collapse; only runs labelled at step >=
   `COUNTABLE_FROM` (30) count, so that the warning is due after at least `WARNING_HISTORY` (10) steps of
   the run (a run labelled at 21 would need it at step 1, from one point), and the check says how many could;
3. no critical finding on any control (a run labelled neither collapsing nor damaged).
Pure apart from reading log files through `monitor.importers` (`labelled_runs`, `real_runs`).
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from contracts import metrics as M
from lldmon_lab.labels import (
    COLLAPSE,
    DAMAGE_RULE_TEXT,
    DAMAGED,
    HEALTHY,
    collapse_step,
    lost_half,
)
from lldmon_lab.run_labels import DEFAULT_LABELS, LabelsError, RunLabel, read_labels
from lldmon_lab.scenarios import Scenario
from monitor.detector import (
    COLLAPSE_WARNINGS,
    LLD_COLLAPSE,
    LLD_DECAY,
    SEVERITY,
    TRAINING_COLLAPSE,
    DetectorConfig,
    OfflineResult,
    detect_offline,
)
from monitor.importers import LogImportError, ParsedLog, load_log

SOURCE_GENERATED = "generated"
SOURCE_LAB = "lab"
SOURCE_THIRD_PARTY = "third-party"
SOURCES = (SOURCE_GENERATED, SOURCE_LAB, SOURCE_THIRD_PARTY)
"""Where labelled runs come from, in report order (module docstring)."""

LEAD_TARGET = 40
"""Median lead time (steps) wanted on collapse runs with hook metrics (a figure, not a target any more)."""
DELAY_TARGET = 5
"""Largest detection delay (steps after the reward collapse) wanted without hook metrics (a figure)."""

CRITICAL_WITHIN: Final = 5
"""Target 1: a critical finding at most this many steps after the labelled collapse (or before it)."""
EARLY_LABEL: Final = 10
EARLY_DEADLINE: Final = 15
"""Target 1 for a collapse labelled at step <= `EARLY_LABEL`: a critical finding by step `EARLY_DEADLINE`."""
WARNING_LEAD: Final = 20
"""Target 2: a warning or critical finding at least this many steps before the labelled collapse."""
WARNING_HISTORY: Final = 10
"""Target 2 applies where the warning is due after at least this many steps of the run: a trend needs
points before it. Project choice."""
COUNTABLE_FROM: Final = WARNING_LEAD + WARNING_HISTORY
"""Target 2 counts the collapsing runs with hook metrics labelled at step >= this."""
HOOK_PREFIX: Final = "lld/"
"""A run with a column under this prefix has the hook likelihood metrics (target 2)."""

TARGET_CRITICAL = "critical finding by label + 5 (by step 15 if label <= 10), collapsing runs"
TARGET_EARLY = "warning >= 20 steps before the label, collapsing runs with lld/* metrics"
TARGET_CONTROLS = "critical findings on controls"


def severity_of(kind: str, fallback: str | None = None) -> str | None:
    """The severity of a finding kind: `monitor.detector.SEVERITY` at call time (new kinds included);
    `fallback` (the finding's own severity) for a kind it does not list."""
    return SEVERITY.get(kind, fallback)


def critical_deadline(label: int) -> int:
    """Last step at which a critical finding meets target 1 for a collapse labelled at `label`."""
    return EARLY_DEADLINE if label <= EARLY_LABEL else label + CRITICAL_WITHIN


def is_damaged(collapses: bool, steps: npt.ArrayLike, series: npt.ArrayLike | None) -> bool:
    """The damaged label (`lldmon_lab.labels`) of a run that does not collapse, on its label series
    (`series`: its reward, or the task success a shaped reward is labelled on; None: not logged)."""
    if collapses or series is None:
        return False
    return lost_half(steps, series)


def has_hook_metrics(
    values: Mapping[str, npt.NDArray[np.float64]], present: Mapping[str, npt.NDArray[np.bool_]] | None
) -> bool:
    """True when at least one `lld/*` metric was logged at some step."""
    for name, column in values.items():
        if not name.startswith(HOOK_PREFIX):
            continue
        logged = present.get(name) if present is not None else None
        if bool(np.any(logged)) if logged is not None else bool(np.any(np.isfinite(column))):
            return True
    return False


@dataclass(frozen=True)
class LabelledRun:
    name: str
    group: str
    steps: npt.NDArray[np.int64]
    values: Mapping[str, npt.NDArray[np.float64]]
    collapses: bool
    """Ground truth: does this run collapse? Controls (False and not `damaged`) are scored for false
    alarms."""
    present: Mapping[str, npt.NDArray[np.bool_]] | None = None
    collapse_step: int | None = None
    """Labelled collapse step; computed from `reward/mean` with `labels.collapse_step` when None and
    `collapses`."""
    source: str = SOURCE_GENERATED
    """generated, lab or third-party (`SOURCES`)."""
    reward_floor: float | None = None
    """The floor of the run's reward design where it is known (the detector's `reward_floor` for this
    run, as a user sets it with the run's detector overrides); None: judged scale-free."""
    reward_metric: str | None = None
    """The task-success series the run's reward rules judge where its optimised reward is shaped (the
    detector's `reward_metric`, declared as a user would); None: `reward/mean`."""
    reward_unit: float = 1.0
    """The size of one unit of the declared reward series in the units the declarations default to (a
    success rate's): the detector's `reward_floor_min_rise` is scaled by it with a declared floor, as a
    user whose reward is in other units declares it."""
    damaged: bool = False
    """Ground truth: not a collapse but not healthy either (`is_damaged`), fixed when the run is labelled
    (judging it in other units or without its declarations does not relabel it)."""

    @property
    def control(self) -> bool:
        """A healthy run: neither collapsing nor damaged (target 3 applies)."""
        return not self.collapses and not self.damaged

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
            reward_floor=0.0,  # the scenarios' reward is a success rate
            damaged=is_damaged(scenario.collapses, scenario.steps, scenario.values.get(M.REWARD_MEAN)),
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
            damaged=is_damaged(collapses, log.steps, log.values.get(M.REWARD_MEAN)),
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
    first_critical: int | None = None
    """First step with a critical finding (severity from `SEVERITY`)."""
    first_critical_kind: str | None = None
    first_warning: int | None = None
    """First step with a warning that announces a collapse (`COLLAPSE_WARNINGS`) or a critical finding:
    what target 2 counts (an advantage-collapse diagnosis does not)."""
    first_warning_kind: str | None = None
    has_hooks: bool = False
    """The run has hook likelihood metrics (`lld/*` columns)."""
    damaged: bool = False
    """Labelled damaged (`LabelledRun.damaged`): neither a collapse nor a control."""
    info_kinds: tuple[str, ...] = ()
    """Kinds of the `info` diagnoses the run got."""

    @property
    def control(self) -> bool:
        return not self.collapses and not self.damaged

    @property
    def label(self) -> str:
        """The three-way label: collapse, damaged or healthy (`lldmon_lab.labels`)."""
        return COLLAPSE if self.collapses else DAMAGED if self.damaged else HEALTHY

    @property
    def deadline(self) -> int | None:
        """Target 1: last step for a critical finding (None: not a collapsing run with a label)."""
        if not self.collapses or self.collapse_step is None:
            return None
        return critical_deadline(self.collapse_step)

    @property
    def critical_in_time(self) -> bool:
        """Target 1 met: a collapsing run with a critical finding by its deadline."""
        deadline = self.deadline
        return deadline is not None and self.first_critical is not None and self.first_critical <= deadline

    @property
    def early_countable(self) -> bool:
        """Target 2 applies: a collapsing run with hook metrics labelled at step >= `COUNTABLE_FROM`."""
        return (
            self.collapses
            and self.has_hooks
            and self.collapse_step is not None
            and self.collapse_step >= COUNTABLE_FROM
        )

    @property
    def warned_early(self) -> bool:
        """Target 2 met: a collapse warning or critical finding >= `WARNING_LEAD` steps before the label."""
        return (
            self.early_countable
            and self.first_warning is not None
            and self.collapse_step is not None
            and self.first_warning <= self.collapse_step - WARNING_LEAD
        )

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
        """A control run with a critical finding (target 3)."""
        return self.control and bool(self.critical_kinds)


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
    critical_in_time: int = 0
    """Target 1: collapsing runs with a critical finding by their deadline (of `collapsing`)."""
    hooked_collapsing: int = 0
    """Collapsing runs with hook likelihood metrics."""
    early_countable: int = 0
    """Target 2: of those, the ones labelled at step >= `COUNTABLE_FROM`."""
    warned_early: int = 0
    """Target 2: of the countable ones, those warned >= `WARNING_LEAD` steps before the label."""
    damaged: int = 0
    """Runs labelled damaged (neither collapsing nor controls)."""
    damaged_with_critical: int = 0
    """Of those, the ones with a critical finding (neither owed nor a false alarm)."""
    warnings_on_controls: tuple[tuple[str, int], ...] = ()
    """(kind, controls that got it at some point) per warning kind, most frequent first: a warning
    most healthy runs get is noise."""
    info_on_controls: tuple[tuple[str, int], ...] = ()
    """The same for the `info` diagnoses (shown with the run, sent to no sink by default)."""


@dataclass(frozen=True)
class TargetCheck:
    name: str
    value: str
    target: str
    met: bool
    source: str = "all"
    offending: tuple[str, ...] = ()
    """The runs that miss it, each with the numbers why ("name (label 11, first critical none)")."""


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
    first_alert = result.first(LLD_DECAY, LLD_COLLAPSE, TRAINING_COLLAPSE)
    severity = {f.kind: severity_of(f.kind, f.severity) for f in result.findings}
    flagged = sorted(
        (f.first_step, f.kind) for f in result.findings if severity[f.kind] in ("warning", "critical")
    )
    critical_spans = sorted((f.first_step, f.kind) for f in result.findings if severity[f.kind] == "critical")
    warning_spans = sorted(
        (f.first_step, f.kind)
        for f in result.findings
        if severity[f.kind] == "critical" or f.kind in COLLAPSE_WARNINGS
    )
    first_collapse = result.first(LLD_COLLAPSE, TRAINING_COLLAPSE)
    lead = None if label is None or first_alert is None else label - first_alert
    delay = None if label is None or first_collapse is None else first_collapse - label
    critical = sorted({kind for kind, sev in severity.items() if sev == "critical"})
    warnings = sorted({kind for kind, sev in severity.items() if sev == "warning"})
    infos = sorted({kind for kind, sev in severity.items() if sev == "info"})
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
        info_kinds=tuple(infos),
        phase_path=path,
        source=run.source,
        first_finding=flagged[0][0] if flagged else None,
        first_finding_kind=flagged[0][1] if flagged else None,
        first_critical=critical_spans[0][0] if critical_spans else None,
        first_critical_kind=critical_spans[0][1] if critical_spans else None,
        first_warning=warning_spans[0][0] if warning_spans else None,
        first_warning_kind=warning_spans[0][1] if warning_spans else None,
        has_hooks=has_hook_metrics(run.values, run.present),
        damaged=run.damaged,
    )


def summarise(group: str, reports: Sequence[RunReport]) -> GroupSummary:
    collapsing = [r for r in reports if r.collapses]
    leads = [r.lead_time for r in collapsing if r.lead_time is not None]
    delays = [r.detection_delay for r in collapsing if r.detection_delay is not None]
    controls = [r for r in reports if r.control]
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
    controls = [r for r in reports if r.control]
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
        critical_in_time=sum(r.critical_in_time for r in collapsing),
        hooked_collapsing=sum(r.has_hooks for r in collapsing),
        early_countable=sum(r.early_countable for r in collapsing),
        warned_early=sum(r.warned_early for r in collapsing),
        damaged=sum(r.damaged for r in reports),
        damaged_with_critical=sum(r.damaged and bool(r.critical_kinds) for r in reports),
        warnings_on_controls=_per_kind(r.warning_kinds for r in controls),
        info_on_controls=_per_kind(r.info_kinds for r in controls),
    )


def _per_kind(kinds_per_run: Iterable[Sequence[str]]) -> tuple[tuple[str, int], ...]:
    """(kind, runs that had it) per kind, most frequent first."""
    counts = Counter(k for kinds in kinds_per_run for k in set(kinds))
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def by_source(reports: Sequence[RunReport]) -> dict[str, list[RunReport]]:
    """Reports per source, in `SOURCES` order (unknown sources after them, in order of appearance)."""
    out: dict[str, list[RunReport]] = {s: [] for s in SOURCES}
    for r in reports:
        out.setdefault(r.source, []).append(r)
    return {s: rs for s, rs in out.items() if rs}


def source_targets(reports: Sequence[RunReport]) -> list[TargetCheck]:
    """`check_targets` on each source separately (every check names its source)."""
    return [t for s, rs in by_source(reports).items() for t in check_targets(rs, source=s)]


def _at(step: int | None, kind: str | None = None) -> str:
    if step is None:
        return "none"
    return f"{step} ({kind})" if kind else str(step)


def check_targets(reports: Sequence[RunReport], source: str = "all") -> list[TargetCheck]:
    """The three targets (module docstring) over whatever runs are present: a target is checked only when
    there are runs it applies to (target 2 is listed whenever there are collapsing runs with hook metrics,
    met when every countable one is warned in time)."""
    checks: list[TargetCheck] = []
    collapsing = [r for r in reports if r.collapses]
    if collapsing:
        missed = [r for r in collapsing if not r.critical_in_time]
        checks.append(
            TargetCheck(
                TARGET_CRITICAL,
                f"{len(collapsing) - len(missed)}/{len(collapsing)}",
                "all",
                not missed,
                source,
                tuple(
                    f"{r.name} (label {_at(r.collapse_step)}, deadline {_at(r.deadline)}, "
                    f"first critical {_at(r.first_critical, r.first_critical_kind)})"
                    for r in missed
                ),
            )
        )
    hooked = [r for r in collapsing if r.has_hooks]
    if hooked:
        countable = [r for r in hooked if r.early_countable]
        late = [r for r in countable if not r.warned_early]
        checks.append(
            TargetCheck(
                TARGET_EARLY,
                f"{len(countable) - len(late)}/{len(countable)} countable "
                f"({len(hooked) - len(countable)} of {len(hooked)} labelled before step {COUNTABLE_FROM})",
                "all countable",
                not late,
                source,
                tuple(
                    f"{r.name} (label {_at(r.collapse_step)}, "
                    f"first warning {_at(r.first_warning, r.first_warning_kind)})"
                    for r in late
                ),
            )
        )
    controls = [r for r in reports if r.control]
    if controls:
        bad = [r for r in controls if r.false_alarm]
        checks.append(
            TargetCheck(
                TARGET_CONTROLS,
                f"{len(bad)}/{len(controls)}",
                "0",
                not bad,
                source,
                tuple(
                    f"{r.name} (first critical {_at(r.first_critical, r.first_critical_kind)}; "
                    f"{','.join(r.critical_kinds)})"
                    for r in bad
                ),
            )
        )
    return checks


def run_config(run: LabelledRun, config: DetectorConfig, scale_free: bool = False) -> DetectorConfig:
    """The detector configuration `run` is judged with: `config` with the run's declarations (as its
    detector overrides would set them in the service: the reward series, its floor, the floor's minimum
    rise in the run's reward units), or without any floor when `scale_free`."""
    floor = None if scale_free else run.reward_floor
    metric = config.reward_metric if run.reward_metric is None else run.reward_metric
    rise = config.reward_floor_min_rise * run.reward_unit
    return replace(config, reward_floor=floor, reward_metric=metric, reward_floor_min_rise=rise)


def evaluate(
    runs: Iterable[LabelledRun], config: DetectorConfig | None = None, scale_free: bool = False
) -> EvaluationReport:
    """Score the detector on `runs`, each judged with `run_config` (its reward design's floor where
    known; `scale_free`: every run judged on its own range and noise alone)."""
    cfg = DetectorConfig() if config is None else config
    return report_of(
        [
            score_run(
                run, detect_offline(run.steps, run.values, run_config(run, cfg, scale_free), run.present)
            )
            for run in runs
        ]
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
                "label",
                "crash",
                "alert",
                "collapse",
                "lead",
                "delay",
                "first finding",
                "first critical",
                "deadline",
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
                    r.label,
                    r.collapse_step,
                    r.first_alert,
                    r.first_collapse,
                    r.lead_time,
                    r.detection_delay,
                    None if r.first_finding is None else f"{r.first_finding} ({r.first_finding_kind})",
                    None if r.first_critical is None else f"{r.first_critical} ({r.first_critical_kind})",
                    r.deadline,
                    ",".join(r.critical_kinds) or "-",
                    ",".join(r.warning_kinds) or "-",
                ]
                for r in report.runs
            ],
        )
        lines.append("")
    lines.append("score per source (crash: labelled collapse, lldmon_lab/labels.py; alert: first")
    lines.append("lld_decay/lld_collapse finding; lead = crash - alert, > 0 caught before the collapse;")
    lines.append(
        f"critical<=deadline: a critical finding by crash + {CRITICAL_WITHIN} (by step {EARLY_DEADLINE} if crash"
        f" <= {EARLY_LABEL}); warn>={WARNING_LEAD} before: runs with lld/* metrics labelled >= {COUNTABLE_FROM}):"
    )
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
            "critical<=deadline",
            f"warn>={WARNING_LEAD} before",
            "controls",
            "false alarms",
            "decay warn (controls)",
            "damaged (critical)",
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
                f"{s.critical_in_time}/{s.collapsing}",
                f"{s.warned_early}/{s.early_countable} ({s.hooked_collapsing} hooked)",
                s.controls,
                s.false_alarms,
                s.decay_warnings_on_controls,
                f"{s.damaged} ({s.damaged_with_critical})",
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
    lines.append("targets per source (false alarm: a critical finding on a control):")
    lines += _table(
        ["source", "target", "value", "wanted", "met"],
        [[t.source, t.name, t.value, t.target, "yes" if t.met else "NO"] for t in report.targets],
    )
    for t in report.targets:
        if t.offending:
            lines.append(f"[{t.source}] {t.name}: missed by")
            lines += [f"  {run}" for run in t.offending]
    lines.append("warnings on controls (controls that got each warning kind at some point; info: diagnoses):")
    for src in report.sources:
        kinds = ", ".join(f"{k} {n}" for k, n in src.warnings_on_controls) or "none"
        infos = ", ".join(f"{k} {n}" for k, n in src.info_on_controls) or "none"
        lines.append(f"  {src.source} ({src.controls} controls): {kinds}; info: {infos}")
    damaged = [r for r in report.runs if r.damaged]
    if damaged:
        lines.append(f"{DAMAGE_RULE_TEXT}; these runs are not scored:")
        lines += [
            f"  [{r.source}] {r.name} (first critical {_at(r.first_critical, r.first_critical_kind)})"
            for r in damaged
        ]
    return "\n".join(lines)


@dataclass(frozen=True)
class LabelledRuns:
    """The runs of a labels file whose files exist, and the entries skipped because a file is missing."""

    runs: list[LabelledRun]
    missing: list[RunLabel]
    labels: Path


def labelled_run(label: RunLabel, source: str = SOURCE_THIRD_PARTY, group: str = "real") -> LabelledRun:
    """One labels-file entry imported and labelled (`lldmon_lab.run_labels`). Raises `LabelsError` naming the
    entry when its log cannot be imported, when `collapse_step` is not a step of the run, or when it
    collapses without a `collapse_step` and the collapse rule finds none."""
    try:
        log = load_log(label.paths, label.fmt)
    except LogImportError as exc:
        raise LabelsError(f"{label.where()}: field 'path': {exc}") from None
    step = label.collapse_step
    if label.collapses and step is None:
        step = collapse_step(log.steps, log.values.get(M.REWARD_MEAN, np.full(log.steps.size, np.nan)))
        if step is None:
            raise LabelsError(
                f"{label.where()}: field 'collapse_step': missing, and the collapse rule "
                "(lldmon_lab/labels.py) finds no collapse in its reward/mean; give collapse_step"
            )
    elif step is not None and log.steps.size and not (log.steps[0] <= step <= log.steps[-1]):
        raise LabelsError(
            f"{label.where()}: field 'collapse_step': {step} is outside the run's steps "
            f"({int(log.steps[0])}-{int(log.steps[-1])})"
        )
    run = LabelledRun.from_log(label.name, log, group=group, collapses=label.collapses, source=source)
    return replace(run, collapse_step=step, reward_floor=label.reward_floor)


def labelled_runs(
    labels: str | os.PathLike[str] = DEFAULT_LABELS, root: str | os.PathLike[str] | None = None
) -> LabelledRuns:
    """The runs of a labels file (default: the repo's labels of ../shared/datasets/real_runs), paths
    relative to `root` (default: the labels file's folder), source "third-party". Entries whose files are
    missing are skipped and listed in `missing`; any other problem raises `LabelsError`."""
    entries = read_labels(labels, root)
    runs: list[LabelledRun] = []
    missing: list[RunLabel] = []
    for label in entries:
        if label.missing_files():
            missing.append(label)
        else:
            runs.append(labelled_run(label))
    return LabelledRuns(runs=runs, missing=missing, labels=Path(labels))


FOUND_LABELS: Final = Path(__file__).resolve().parent / "eval_labels" / "found_runs.toml"
"""Labels of the licensed third-party logs committed under tests/fixtures/third_party (package data)."""


def found_runs() -> list[LabelledRun]:
    """The licensed third-party logs of `tests/fixtures/third_party` of the source checkout this package
    runs from (an editable install), labelled by `FOUND_LABELS`; none from an installed wheel, which does
    not ship them."""
    root = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "third_party"
    return labelled_runs(FOUND_LABELS, root).runs if root.is_dir() else []


def real_runs(root: Path, labels: str | os.PathLike[str] = DEFAULT_LABELS) -> list[LabelledRun]:
    """The real logs under `root` (../shared/datasets/real_runs) with their labels from `labels` (the
    repo's labels file by default); entries whose files are missing are skipped."""
    return labelled_runs(labels, root).runs
