"""`update` (online, one batch of new points) and `detect_offline` (a whole run, point by point)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from contracts import metrics as M
from monitor.detector import findings as F
from monitor.detector import phases
from monitor.detector.config import DetectorConfig
from monitor.detector.signals import (
    HOOK_METRICS,
    USED_METRICS,
    History,
    Signals,
    compute,
    recent_median,
    reward_smoothed,
    reward_trailing_means,
)
from monitor.detector.state import DetectorState
from monitor.detector.types import (
    BoolArray,
    Finding,
    FloatArray,
    IntArray,
    PhaseChange,
    SeriesWindow,
    StepResult,
)


def _history(window: SeriesWindow, lo: int, hi: int) -> History:
    steps = window.steps[lo:hi]
    values: dict[str, FloatArray] = {}
    present: dict[str, BoolArray] = {}
    for name in USED_METRICS:
        v = window.values.get(name)
        if v is not None:
            values[name] = v[lo:hi]
            present[name] = window.present[name][lo:hi]
    return History(
        steps=(steps - steps[-1]).astype(np.float64), values=values, present=present, step=int(steps[-1])
    )


def _first_index(steps: IntArray, i: int, horizon: int) -> int:
    """Index of the first point within `horizon` steps of point i (the points it is judged on)."""
    return int(np.searchsorted(steps, steps[i] - horizon + 1, side="left"))


def _update_peaks(h: History, state: DetectorState, cfg: DetectorConfig) -> None:
    r = reward_smoothed(h, cfg)
    if math.isfinite(r) and (state.reward_peak is None or r > state.reward_peak):
        state.reward_peak = r
        state.reward_peak_step = h.step
    logged, _ = h.logged_now(M.REWARD_MEAN)
    if logged:
        steps, means = reward_trailing_means(h, cfg, last=cfg.reward_zero_mean_window + 1)
        if steps.size and math.isfinite(means[-1]) and steps[-1] == h.steps[-1]:
            m = float(means[-1])
            if state.reward_mean_peak is None or m > state.reward_mean_peak:
                state.reward_mean_peak = m
    e = recent_median(h, M.ENTROPY_MEAN, cfg.entropy_collapse_window, cfg.min_recent_points)
    if math.isfinite(e) and (state.entropy_peak is None or e > state.entropy_peak):
        state.entropy_peak = e
    logged, _ = h.logged_now(M.ANCHOR_LOGP)
    if logged:
        a = recent_median(h, M.ANCHOR_LOGP, 1, cfg.anchor_smooth_points)
        enough = h.finite_index(M.ANCHOR_LOGP).size >= cfg.anchor_smooth_points and math.isfinite(a)
        if enough and (state.anchor_peak is None or a > state.anchor_peak):
            state.anchor_peak = a


def _finding(kind: str, record: dict[str, object], step: int) -> Finding:
    evidence = dict(record["evidence"])  # type: ignore[call-overload]
    evidence["active_at"] = step
    return Finding(
        kind=kind,
        severity=F.SEVERITY[kind],
        step=int(record["since"]),  # type: ignore[call-overload]
        message=str(record["message"]),
        evidence=evidence,
    )


def process_point(
    h: History, state: DetectorState, cfg: DetectorConfig
) -> tuple[PhaseChange | None, list[Finding]]:
    """Advance `state` (in place) by the current point of `h`; returns the phase change (if any) and the
    findings that started at this point."""
    state.n_points += 1
    if state.first_step is None:
        state.first_step = h.step
    if not state.hooks_seen and any(h.logged_now(m)[0] for m in HOOK_METRICS):
        state.hooks_seen = True
    _update_peaks(h, state, cfg)
    judged = h.step - state.first_step >= cfg.warmup_steps
    sig: Signals = compute(h, cfg, state.reward_peak, state.hooks_seen, state.anchor_peak)
    conds = F.conditions(h, sig, cfg, state)
    criticals = [c.kind for c in conds if F.SEVERITY[c.kind] == "critical"]
    if any(c.kind == F.ENTROPY_EXPLOSION for c in conds):
        degraded_outputs = F.outputs_degraded(h, cfg)
        if degraded_outputs:  # an entropy explosion that takes the outputs with it is a collapse
            criticals.append(F.ENTROPY_EXPLOSION_DEGRADED)

    change = phases.advance(state, sig, h.step, cfg, criticals, judged)
    conds.extend(F.phase_conditions(sig, state))
    started: list[Finding] = []
    now = {c.kind for c in conds}
    for kind in [k for k in state.active if k not in now]:
        del state.active[kind]
    for c in conds:
        record = state.active.get(c.kind)
        if record is None:
            record = {"since": h.step, "severity": F.SEVERITY[c.kind]}
            state.active[c.kind] = record
            record.update(message=c.message, evidence=c.evidence)
            started.append(_finding(c.kind, record, h.step))
        else:
            record.update(message=c.message, evidence=c.evidence)
    state.last_step = h.step
    return change, started


def update(window: SeriesWindow, state: DetectorState | None, config: DetectorConfig) -> StepResult:
    """Process every point of `window` newer than `state.last_step`, in order (online).

    Each point is judged on the points of the `config.required_history` steps ending at it, so a window
    should hold the new points plus the points of the `required_history - 1` steps before them; results
    are then identical whatever the batch sizes (see `detect_offline`). The input state is not modified."""
    st = DetectorState() if state is None else state.copy()
    steps = window.steps
    start = 0 if st.last_step is None else int(np.searchsorted(steps, st.last_step, side="right"))
    changes: list[PhaseChange] = []
    started: list[Finding] = []
    horizon = config.required_history
    for i in range(start, steps.size):
        h = _history(window, _first_index(steps, i, horizon), i + 1)
        change, new = process_point(h, st, config)
        if change is not None:
            changes.append(change)
        started.extend(new)
    last = st.last_step if st.last_step is not None else 0
    findings = [_finding(kind, record, last) for kind, record in st.active.items()]
    return StepResult(state=st, phase_changes=changes, findings=findings, started=started)


@dataclass(frozen=True)
class FindingSpan:
    """One episode of a finding over an offline run."""

    kind: str
    severity: str
    first_step: int
    last_step: int
    message: str
    evidence: dict[str, object]
    """Evidence when the episode started."""


@dataclass(frozen=True)
class OfflineResult:
    steps: IntArray
    phases: npt.NDArray[np.str_]
    """Phase after each point (aligned with `steps`)."""
    phase_changes: list[PhaseChange]
    findings: list[FindingSpan]
    state: DetectorState
    degraded: bool
    """True when the run never sent a likelihood metric (phases I-II could not be judged)."""

    def first(self, *kinds: str) -> int | None:
        """First step at which any finding of these kinds was active (None if never)."""
        firsts = [f.first_step for f in self.findings if f.kind in kinds]
        return min(firsts) if firsts else None

    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}


def detect_offline(
    steps: npt.ArrayLike,
    values: Mapping[str, npt.ArrayLike],
    config: DetectorConfig | None = None,
    present: Mapping[str, npt.ArrayLike] | None = None,
) -> OfflineResult:
    """Run `update` point by point over a whole run (exactly what online use with one-point batches
    gives; any batching gives the same results). Without `present`, NaN means "not logged"."""
    cfg = DetectorConfig() if config is None else config
    full = SeriesWindow.from_columns(steps, values, present)
    n = len(full)
    horizon = cfg.required_history
    state: DetectorState | None = None
    phase_list: list[str] = []
    changes: list[PhaseChange] = []
    open_spans: dict[tuple[str, int], list[object]] = {}
    spans: list[FindingSpan] = []
    for i in range(n):
        lo = _first_index(full.steps, i, horizon)
        window = SeriesWindow(
            steps=full.steps[lo : i + 1],
            values={k: v[lo : i + 1] for k, v in full.values.items()},
            present={k: v[lo : i + 1] for k, v in full.present.items()},
        )
        result = update(window, state, cfg)
        state = result.state
        phase_list.append(state.phase)
        changes.extend(result.phase_changes)
        step = int(full.steps[i])
        for f in [*result.started, *result.findings]:
            key = (f.kind, f.step)
            if key in open_spans:
                open_spans[key][3] = step
            else:
                open_spans[key] = [f.kind, f.severity, f.step, step, f.message, f.evidence]
    for kind, severity, first, last, message, evidence in open_spans.values():
        spans.append(
            FindingSpan(
                kind=str(kind),
                severity=str(severity),
                first_step=int(first),  # type: ignore[call-overload]
                last_step=int(last),  # type: ignore[call-overload]
                message=str(message),
                evidence=dict(evidence),  # type: ignore[call-overload]
            )
        )
    spans.sort(key=lambda s: (s.first_step, s.kind))
    return OfflineResult(
        steps=full.steps,
        phases=np.array(phase_list, dtype=np.str_),
        phase_changes=changes,
        findings=spans,
        state=state if state is not None else DetectorState(),
        degraded=not (state is not None and state.hooks_seen),
    )


__all__ = ["FindingSpan", "OfflineResult", "detect_offline", "process_point", "update"]
