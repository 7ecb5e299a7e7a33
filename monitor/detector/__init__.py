"""LLD phase detection: pure numpy functions over metric series (no I/O, no database, no logging).

`update(window, state, config)` processes the new points of one run online; `detect_offline` runs it over a
whole run. Phases and findings follow lld-reference.md sections 2-3; thresholds live in `DetectorConfig`.
"""

from monitor.detector.config import DetectorConfig
from monitor.detector.engine import FindingSpan, OfflineResult, detect_offline, update
from monitor.detector.findings import (
    ADVANTAGE_COLLAPSE,
    ALL_KINDS,
    CLIP_RATIO_SATURATED,
    COLLAPSE_WARNINGS,
    DEAD_RUN,
    ENTROPY_COLLAPSE,
    ENTROPY_EXPLOSION,
    GARBLED_OUTPUTS,
    INVALID_ACTION_SURGE,
    KL_BLOWUP,
    LENGTH_COLLAPSE,
    LENGTH_EXPLOSION,
    LLD_COLLAPSE,
    LLD_DECAY,
    NONFINITE_GRAD,
    NONFINITE_LOSS,
    RATIO_BLOWUP,
    REWARD_ZERO,
    SEVERITY,
    TERMINAL_KINDS,
    TRAINING_COLLAPSE,
)
from monitor.detector.signals import DEGRADED_EXPLANATION
from monitor.detector.state import DetectorState
from monitor.detector.types import (
    COLLAPSE,
    DECAY,
    HEALTHY,
    PHASES,
    STAGNATION,
    WARMUP,
    Finding,
    PhaseChange,
    SeriesWindow,
    StepResult,
)

__all__ = [
    "ADVANTAGE_COLLAPSE",
    "ALL_KINDS",
    "CLIP_RATIO_SATURATED",
    "COLLAPSE",
    "COLLAPSE_WARNINGS",
    "DEAD_RUN",
    "DECAY",
    "DEGRADED_EXPLANATION",
    "ENTROPY_COLLAPSE",
    "ENTROPY_EXPLOSION",
    "GARBLED_OUTPUTS",
    "HEALTHY",
    "INVALID_ACTION_SURGE",
    "KL_BLOWUP",
    "LENGTH_COLLAPSE",
    "LENGTH_EXPLOSION",
    "LLD_COLLAPSE",
    "LLD_DECAY",
    "NONFINITE_GRAD",
    "NONFINITE_LOSS",
    "PHASES",
    "RATIO_BLOWUP",
    "REWARD_ZERO",
    "SEVERITY",
    "STAGNATION",
    "TERMINAL_KINDS",
    "TRAINING_COLLAPSE",
    "WARMUP",
    "DetectorConfig",
    "DetectorState",
    "Finding",
    "FindingSpan",
    "OfflineResult",
    "PhaseChange",
    "SeriesWindow",
    "StepResult",
    "detect_offline",
    "update",
]
