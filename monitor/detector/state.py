"""What the detector carries from one batch to the next (JSON-serialisable, persisted by the service)."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Final

STATE_VERSION: Final = 1


@dataclass
class DetectorState:
    phase: str = "warmup"
    phase_since: int | None = None
    last_step: int | None = None
    n_points: int = 0
    """Points processed so far (the warm-up counts these)."""
    pending_phase: str | None = None
    """Hysteresis: the phase the recent points point to, and for how many consecutive points."""
    pending_count: int = 0
    reward_peak: float | None = None
    """Running peak of the smoothed reward (the window may be truncated, so the peak lives here)."""
    reward_peak_step: int | None = None
    reward_mean_peak: float | None = None
    """Running peak of the reward's trailing mean (`DetectorConfig.reward_zero_mean_window` steps), the
    collapse label's statistic; a state saved before it existed restarts it from the next point."""
    reward_low: float | None = None
    """Running minimum of the smoothed reward: the low end of the run's own reward range (with
    `reward_peak`), so reward rules hold in any units."""
    reward_mean_low: float | None = None
    """Running minimum of the reward's trailing mean (with `reward_mean_peak`)."""
    reward_noise: float | None = None
    """Noise SD of the reward's trailing mean: the largest measured while the run was in the upper half of
    its range (`engine._update_reward_noise`), the scale every reward drop is measured in."""
    reward_start: float | None = None
    """The first trailing mean of the reward with `DetectorConfig.min_recent_points` values: where the run
    started (a run that never rose significantly above it has not learned)."""
    learned: bool = False
    """The reward's trailing mean has risen significantly above its start at some point."""
    not_learning_since: int | None = None
    """First step of a run judged not learning (garbled / empty outputs from its start, no reward rise)."""
    entropy_peak: float | None = None
    """Running peak of the smoothed entropy (entropy-collapse diagnosis)."""
    anchor_peak: float | None = None
    """Running peak of the anchor set's smoothed log-prob (phase II on the anchor set)."""
    first_step: int | None = None
    """The run's first logged step (the warm-up counts steps from it)."""
    hooks_seen: bool = False
    """The run's source has sent a likelihood metric at some point: phases I-II are judged from then on,
    whatever the density of those metrics (degraded mode is decided by the source, not by a count)."""
    collapse_kind: str | None = None
    """While in phase III: `lld_collapse` (with likelihood evidence) or `training_collapse` (without)."""
    collapse_reasons: list[str] = field(default_factory=list)
    """The signals and findings that moved the run into phase III."""
    counters: dict[str, int] = field(default_factory=dict)
    """Hysteresis / latch counters of the findings, by name."""
    active: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Active findings by kind: {"since": first step, "severity": ..., "message": ..., "evidence": ...}."""
    version: int = STATE_VERSION

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy (non-finite floats become None)."""
        out = dataclasses.asdict(self)
        return _json_safe(out)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DetectorState:
        version = data.get("version", STATE_VERSION)
        if version != STATE_VERSION:
            raise ValueError(f"detector state version {version} is not supported (expected {STATE_VERSION})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown detector state fields: {sorted(unknown)}")
        return cls(**copy.deepcopy(data))

    def copy(self) -> DetectorState:
        """An independent copy. Evidence dicts are never mutated once stored, so they are shared."""
        return dataclasses.replace(
            self,
            counters=dict(self.counters),
            active={k: dict(v) for k, v in self.active.items()},
            collapse_reasons=list(self.collapse_reasons),
        )


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj
