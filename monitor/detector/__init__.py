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
    ENTROPY_COLLAPSE,
    GARBLED_OUTPUTS,
    KL_BLOWUP,
    LENGTH_COLLAPSE,
    LLD_COLLAPSE,
    LLD_DECAY,
    NONFINITE_GRAD,
    NONFINITE_LOSS,
    RATIO_BLOWUP,
    REWARD_ZERO,
    SEVERITY,
    TERMINAL_KINDS,
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
    "DECAY",
    "DEGRADED_EXPLANATION",
    "ENTROPY_COLLAPSE",
    "GARBLED_OUTPUTS",
    "HEALTHY",
    "KL_BLOWUP",
    "LENGTH_COLLAPSE",
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
