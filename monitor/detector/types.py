"""Inputs and outputs of the detector: a window of series, phase changes, findings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from monitor.detector.state import DetectorState

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

Severity = Literal["info", "warning", "critical"]
"""`info`: a diagnosis worth showing next to the run but not worth a notification (sinks send
`warning` and up by default)."""

# --- phases (docs/science.md section 3) -----------------------------------------------------------------
WARMUP: Final = "warmup"
HEALTHY: Final = "healthy"
STAGNATION: Final = "stagnation"
"""Phase I: correct-response likelihood flat while the reward rises."""
DECAY: Final = "decay"
"""Phase II: slow, consistent decline of the correct-response likelihood, reward still rising."""
COLLAPSE: Final = "collapse"
"""Phase III: accelerated likelihood decline with a grad-norm / entropy surge, or a reward crash."""
NOT_LEARNING: Final = "not_learning"
"""Not a phase of LLD: the run never learned (no reward rise, garbled or empty outputs from its start)."""
PHASES: Final = (WARMUP, HEALTHY, STAGNATION, DECAY, COLLAPSE, NOT_LEARNING)


@dataclass(frozen=True)
class SeriesWindow:
    """Recent history of one run, steps ascending (unique). `values[name]` is aligned with `steps`, NaN
    where a metric was not logged at that step OR was NaN; `present[name]` says a value was logged there
    (NaN / inf included). A non-finite grad norm or loss is a terminal signal only where it is present."""

    steps: IntArray
    values: dict[str, FloatArray]
    present: dict[str, BoolArray]

    def __post_init__(self) -> None:
        steps = self.steps
        if steps.ndim != 1:
            raise ValueError("steps must be 1-D")
        if steps.size > 1 and not bool(np.all(np.diff(steps) > 0)):
            raise ValueError("steps must be strictly ascending")
        for name, arr in self.values.items():
            if arr.shape != steps.shape:
                raise ValueError(f"values[{name!r}] has {arr.shape[0]} points for {steps.size} steps")
            if name not in self.present:
                raise ValueError(f"present[{name!r}] is missing")
        for name, mask in self.present.items():
            if mask.shape != steps.shape:
                raise ValueError(f"present[{name!r}] has {mask.shape[0]} points for {steps.size} steps")

    @classmethod
    def from_columns(
        cls,
        steps: npt.ArrayLike,
        values: Mapping[str, npt.ArrayLike],
        present: Mapping[str, npt.ArrayLike] | None = None,
    ) -> SeriesWindow:
        """Build a window, converting dtypes. Without `present`, a value counts as logged unless it is NaN
        (so +-inf is data, NaN is "not logged"); pass `present` to mark logged NaNs."""
        steps_arr = np.asarray(steps, dtype=np.int64).ravel()
        vals = {name: np.asarray(v, dtype=np.float64).ravel() for name, v in values.items()}
        pres: dict[str, BoolArray]
        if present is None:
            pres = {name: ~np.isnan(v) for name, v in vals.items()}
        else:
            pres = {name: np.asarray(present[name], dtype=np.bool_).ravel() for name in vals}
        return cls(steps=steps_arr, values=vals, present=pres)

    def __len__(self) -> int:
        return int(self.steps.size)

    def tail(self, n: int) -> SeriesWindow:
        """The last n points."""
        start = max(0, self.steps.size - n)
        return SeriesWindow(
            steps=self.steps[start:],
            values={k: v[start:] for k, v in self.values.items()},
            present={k: v[start:] for k, v in self.present.items()},
        )


@dataclass(frozen=True)
class PhaseChange:
    step: int
    phase: str
    previous_phase: str | None
    evidence: dict[str, Any]
    """JSON-able: the signals that fired (statistic, threshold, window), `degraded` and its explanation."""


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: Severity
    step: int
    """First step of this episode of the condition (stable while it stays active: a dedupe key together
    with `kind`); `evidence["active_at"]` is the step it was last seen active."""
    message: str
    evidence: dict[str, Any]


@dataclass(frozen=True)
class StepResult:
    state: DetectorState
    phase_changes: list[PhaseChange]
    findings: list[Finding]
    """Conditions active at the last processed step (the service dedupes / resolves alerts)."""
    started: list[Finding] = field(default_factory=list)
    """Episodes that began during this call, including ones already over by its last step (e.g. a single
    NaN grad norm in the middle of a batch), so a batch never hides a transient terminal signal."""
