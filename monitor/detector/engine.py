"""`update` (online, one batch of new points) and `detect_offline` (a whole run, point by point)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

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
    Indicator,
    RewardRange,
    Signals,
    compute,
    recent_median,
    reward_mean_noise,
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


def _history(window: SeriesWindow, lo: int, hi: int, reward: str) -> History:
    steps = window.steps[lo:hi]
    values: dict[str, FloatArray] = {}
    present: dict[str, BoolArray] = {}
    for name in (*USED_METRICS, reward):
        v = window.values.get(name)
        if v is not None:
            values[name] = v[lo:hi]
            present[name] = window.present[name][lo:hi]
    return History(
        steps=(steps - steps[-1]).astype(np.float64),
        values=values,
        present=present,
        step=int(steps[-1]),
        reward=reward,
    )


def _first_index(steps: IntArray, i: int, horizon: int) -> int:
    """Index of the first point within `horizon` steps of point i (the points it is judged on)."""
    return int(np.searchsorted(steps, steps[i] - horizon + 1, side="left"))


REWARD_POINTS: Final = "reward_points"
"""`DetectorState.counters` key: rewards the run has logged so far."""


def _update_peaks(h: History, state: DetectorState, cfg: DetectorConfig) -> None:
    logged, _ = h.logged_now(h.reward)
    if logged:
        state.counters[REWARD_POINTS] = state.counters.get(REWARD_POINTS, 0) + 1
    # The range of the smoothed reward starts once it is a median of `reward_smooth_points` rewards: a
    # run's first reward is one batch. As a level it set the running peak of a lab run (success 0.36 at
    # step 1 right after its warm-up, then 0.09-0.20 for 80 steps), whose ordinary dip to 0.03 then read
    # as "every recent value at the floor of its range" (a false `reward_zero` page without a declared
    # floor, late-lab seed 7).
    r = (
        reward_smoothed(h, cfg)
        if state.counters.get(REWARD_POINTS, 0) >= cfg.reward_smooth_points
        else math.nan
    )
    if math.isfinite(r):
        if state.reward_peak is None or r > state.reward_peak:
            state.reward_peak = r
            state.reward_peak_step = h.step
        if state.reward_low is None or r < state.reward_low:
            state.reward_low = r
    if logged:
        _update_reward_means(h, state, cfg)
    e = recent_median(h, M.ENTROPY_MEAN, cfg.entropy_collapse_window, cfg.min_recent_points)
    if math.isfinite(e) and (state.entropy_peak is None or e > state.entropy_peak):
        state.entropy_peak = e
    logged, _ = h.logged_now(M.ANCHOR_LOGP)
    if logged:
        a = recent_median(h, M.ANCHOR_LOGP, 1, cfg.anchor_smooth_points)
        enough = h.finite_index(M.ANCHOR_LOGP).size >= cfg.anchor_smooth_points and math.isfinite(a)
        if enough and (state.anchor_peak is None or a > state.anchor_peak):
            state.anchor_peak = a


def _update_reward_means(h: History, state: DetectorState, cfg: DetectorConfig) -> None:
    """Range, start, noise and the `learned` flag of the reward's trailing mean."""
    steps, means = reward_trailing_means(h, cfg, last=cfg.reward_zero_mean_window + 1)
    if not (steps.size and math.isfinite(means[-1]) and steps[-1] == h.steps[-1]):
        return
    young = state.first_step is None or h.step - state.first_step < cfg.reward_zero_mean_window - 1
    if young and cfg.reward_floor is None:
        return  # without a known floor, a partial window's mean (one value at the first step) is no level
    m = float(means[-1])
    if state.reward_mean_peak is None or m > state.reward_mean_peak:
        state.reward_mean_peak = m
    if state.reward_mean_low is None or m < state.reward_mean_low:
        state.reward_mean_low = m
    if state.reward_start is None:
        state.reward_start = m
    _update_reward_noise(h, state, cfg, m)
    if not state.learned:
        start = RewardRange(
            mean_low=state.reward_start,
            mean_peak=state.reward_mean_peak,
            noise=state.reward_noise if state.reward_noise is not None else float("nan"),
            fixed_floor=cfg.reward_floor is not None,
        )
        state.learned = start.rose(cfg)


def _update_reward_noise(h: History, state: DetectorState, cfg: DetectorConfig, m: float) -> None:
    """The reward's noise scale: the largest `reward_mean_noise` measured while the trailing mean was in
    the upper half of the run's range (so the wander of a healthy run is learnt, and a collapse, which
    happens in the lower half, never inflates it). Re-measured every `reward_zero_mean_window` steps."""
    low, peak = state.reward_mean_low, state.reward_mean_peak
    if low is None or peak is None or (peak > low and m < low + 0.5 * (peak - low)):
        return
    last = state.counters.get("reward_noise@step")
    if last is not None and h.step - last < cfg.reward_zero_mean_window:
        return
    noise = reward_mean_noise(h, cfg)
    if not math.isfinite(noise):
        return
    state.counters["reward_noise@step"] = h.step
    if state.reward_noise is None or noise > state.reward_noise:
        state.reward_noise = noise


def reward_range(h: History, state: DetectorState, cfg: DetectorConfig) -> RewardRange:
    """The run's reward range at this point and its noise scale (NaN until measured); with a configured
    `reward_floor`, that floor is the low end."""
    fixed = cfg.reward_floor is not None
    return RewardRange(
        low=cfg.reward_floor if fixed else state.reward_low,
        peak=state.reward_peak,
        mean_low=cfg.reward_floor if fixed else state.reward_mean_low,
        mean_peak=state.reward_mean_peak,
        noise=state.reward_noise if state.reward_noise is not None else float("nan"),
        fixed_floor=fixed,
    )


def _update_not_learning(h: History, state: DetectorState, cfg: DetectorConfig, garbled: Indicator) -> None:
    """A run is not learning while its reward has not risen significantly above its start and its outputs
    have been garbled or empty since its first judged window (`state.not_learning_since`)."""
    if state.learned:
        state.not_learning_since = None
        state.counters.pop("outputs_judged", None)
        return
    if state.counters.get("outputs_judged") or state.not_learning_since is not None:
        return
    length, count = F.median_tail(h, M.RESPONSE_LENGTH_MEAN, cfg)
    empty = count >= cfg.min_recent_points and length <= cfg.empty_response_tokens
    if garbled.statistic is None and count < cfg.min_recent_points:
        return  # neither judged yet
    state.counters["outputs_judged"] = 1
    if garbled.fired or empty:
        state.not_learning_since = h.step


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
    rng = reward_range(h, state, cfg)
    terminals = F.terminal_indicators(h, cfg, state, rng)
    _update_not_learning(h, state, cfg, terminals[F.GARBLED_OUTPUTS])
    pathologies = tuple(
        k for k in F.PATHOLOGY_KINDS if k in state.active or (k in terminals and terminals[k].fired)
    )
    sig: Signals = compute(h, cfg, rng, state.hooks_seen, state.anchor_peak, pathologies)
    conds = F.conditions(h, sig, cfg, state, terminals)
    criticals = [c.kind for c in conds if F.SEVERITY[c.kind] == "critical"]
    if any(c.kind == F.ENTROPY_EXPLOSION for c in conds):
        degraded_outputs = F.outputs_degraded(h, cfg)
        if degraded_outputs:  # an entropy explosion that takes the valid actions with it is a collapse
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
        h = _history(window, _first_index(steps, i, horizon), i + 1, config.reward_metric)
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
