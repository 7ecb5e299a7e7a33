"""The false-alarm budget: critical findings per 10,000 healthy steps, on the controls as recorded and on
the same controls made harder.

A detector tuned on a handful of healthy runs can stay quiet on them and still page on the next one. So
every control is also judged
- with its reward in other units (`AFFINE`: r -> a*r + b, which changes nothing about the run; a floor
  the run declares moves with it),
- shuffled in blocks of `BLOCK_STEPS` steps (the same values, every metric moved together, in another
  order: the run's local texture with none of its history),
- thinned to one value per `THIN_EVERY` steps (TRL's default `logging_steps`; `lldmon_lab.replay`),
and the budget is counted over all of them (`lldmon_lab.evaluation` scores the collapses). Pure apart from
the detector.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np
import numpy.typing as npt

from contracts import metrics as M
from lldmon_lab.evaluation import LabelledRun, run_config, severity_of
from lldmon_lab.replay import thin
from monitor.detector import DetectorConfig, detect_offline

AFFINE: Final = ((3.0, -1.0), (0.5, 2.0), (10.0, -5.0))
"""(a, b) of the reward changes of units: a signed reward, a shifted one, a wide one."""
BLOCK_STEPS: Final = 20
"""Block length of the shuffled series (longer than the detector's short windows, shorter than its
baselines)."""
THIN_EVERY: Final = 10
PER_STEPS: Final = 10_000
"""The budget's unit: critical findings per this many healthy steps."""


@dataclass(frozen=True)
class Budget:
    """Critical findings on the controls of one source under one variant."""

    source: str
    variant: str
    controls: int
    steps: int
    """Healthy steps judged: the sum of each control's span of steps."""
    criticals: int
    """Critical episodes (a kind's span of consecutive activity) over all those controls."""
    runs_with_critical: tuple[str, ...]

    @property
    def per_10k(self) -> float:
        return PER_STEPS * self.criticals / self.steps if self.steps else 0.0


def affine(run: LabelledRun, a: float, b: float) -> LabelledRun:
    """`run` with its reward in other units (a > 0): the optimised reward and the declared reward series
    the detector judges (`LabelledRun.reward_metric`); the declared floor and unit move with them."""
    if a <= 0:
        raise ValueError("a must be > 0 (a change of units keeps the order of rewards)")
    values = dict(run.values)
    for name in {M.REWARD_MEAN, run.reward_metric or M.REWARD_MEAN}:
        if name in values:
            values[name] = a * np.asarray(values[name], dtype=np.float64) + b
    floor = None if run.reward_floor is None else a * run.reward_floor + b
    return replace(
        run,
        name=f"{run.name} [{a:g}r{b:+g}]",
        values=values,
        reward_floor=floor,
        reward_unit=a * run.reward_unit,
    )


def block_shuffled(run: LabelledRun, block: int = BLOCK_STEPS, seed: int = 0) -> LabelledRun:
    """`run` with the local texture of every metric shuffled in blocks of `block` steps: each metric's
    deviations from its own running level (a centred median over `TREND_STEPS` points) are moved
    block-wise, in one permutation for all metrics, and added back to that level. The run keeps its course
    (a learning run still learns: shuffling its raw values would fake the crashes of a rising reward falling
    back to its start) and gets its spikes, dips and noise in another order."""
    steps = np.asarray(run.steps, dtype=np.int64)
    ids = (steps - steps[0]) // block
    order = np.random.default_rng(seed).permutation(np.unique(ids))
    rows = np.concatenate([np.flatnonzero(ids == b) for b in order])
    values = {k: _reshuffled(np.asarray(v, dtype=np.float64), rows) for k, v in run.values.items()}
    return replace(run, name=f"{run.name} [shuffled]", values=values)


TREND_STEPS: Final = 41
"""Points in the centred running median that is a metric's level in `block_shuffled`."""


def _reshuffled(v: npt.NDArray[np.float64], rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Level + deviations taken in the order `rows` (ratios to the level for a metric that is always
    positive, such as a length or a grad norm; differences otherwise); non-finite points keep their
    place and value."""
    finite = np.isfinite(v)
    if finite.sum() < TREND_STEPS:
        return v
    idx = np.flatnonzero(finite)
    positive = bool(np.all(v[idx] > 0))
    x = np.full(v.size, np.nan)
    x[idx] = np.log(v[idx]) if positive else v[idx]
    half = TREND_STEPS // 2
    padded = np.pad(x[idx], half, mode="edge")
    level = np.full(v.size, np.nan)
    level[idx] = np.median(np.lib.stride_tricks.sliding_window_view(padded, TREND_STEPS), axis=1)
    moved = (x - level)[rows]
    moved = moved[np.isfinite(moved)]
    out = v.copy()
    shuffled = level[idx] + moved[: idx.size]
    out[idx] = np.exp(shuffled) if positive else shuffled
    return out


def thinned(run: LabelledRun, every: int = THIN_EVERY) -> LabelledRun:
    steps, values, present = thin(run.steps, run.values, run.present, every)
    return replace(run, name=f"{run.name} [thin {every}]", steps=steps, values=values, present=present)


def variants(run: LabelledRun) -> list[tuple[str, LabelledRun]]:
    """(variant name, run) of every harder series of one control, the control itself first."""
    out = [("as recorded", run)]
    out += [(f"reward {a:g}r{b:+g}", affine(run, a, b)) for a, b in AFFINE]
    out += [(f"shuffled in {BLOCK_STEPS}-step blocks", block_shuffled(run))]
    out += [(f"thinned to 1 in {THIN_EVERY}", thinned(run))]
    return out


def critical_episodes(run: LabelledRun, config: DetectorConfig, scale_free: bool = False) -> int:
    result = detect_offline(run.steps, run.values, run_config(run, config, scale_free), run.present)
    return sum(1 for f in result.findings if severity_of(f.kind, f.severity) == "critical")


def span(run: LabelledRun) -> int:
    steps = np.asarray(run.steps)
    return int(steps[-1] - steps[0] + 1) if steps.size else 0


def judge(
    run: LabelledRun, config: DetectorConfig | None = None, scale_free: bool = False
) -> list[tuple[str, int, int]]:
    """(variant, healthy steps, critical episodes) of every harder series of one control."""
    cfg = DetectorConfig() if config is None else config
    return [(name, span(v), critical_episodes(v, cfg, scale_free)) for name, v in variants(run)]


def budgets(controls: Iterable[LabelledRun], judged: Sequence[list[tuple[str, int, int]]]) -> list[Budget]:
    """Per source and variant, from the controls and their `judge` results (in the same order)."""
    acc: dict[tuple[str, str], Budget] = {}
    for run, rows in zip(controls, judged, strict=True):
        for variant, steps, criticals in rows:
            key = (run.source, variant)
            b = acc.get(key, Budget(run.source, variant, 0, 0, 0, ()))
            acc[key] = Budget(
                b.source,
                b.variant,
                b.controls + 1,
                b.steps + steps,
                b.criticals + criticals,
                (*b.runs_with_critical, run.name) if criticals else b.runs_with_critical,
            )
    return list(acc.values())


def render_budgets(rows: Sequence[Budget]) -> str:
    header = (
        f"{'source':12s} {'variant':30s} {'controls':>8s} {'steps':>8s} {'criticals':>9s} {'per 10k':>8s}"
    )
    lines = ["false-critical budget (critical findings per 10,000 healthy steps):", header, "-" * len(header)]
    for b in rows:
        lines.append(
            f"{b.source:12s} {b.variant:30s} {b.controls:8d} {b.steps:8d} {b.criticals:9d} {b.per_10k:8.2f}"
        )
        if b.runs_with_critical:
            lines.append(f"{'':12s}   with a critical: {', '.join(b.runs_with_critical)}")
    return "\n".join(lines)


__all__ = [
    "AFFINE",
    "BLOCK_STEPS",
    "THIN_EVERY",
    "Budget",
    "affine",
    "block_shuffled",
    "budgets",
    "judge",
    "render_budgets",
    "thinned",
    "variants",
]
