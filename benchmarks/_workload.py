"""Simulated training runs for the streaming benchmarks: canonical metrics + action records per step.

Each run streams what a Search-R1-sized GRPO job with lldmon's hooks sends per optimizer step: one
metrics batch with every canonical metric (`contracts.metrics.CANONICAL_METRICS`, values from the
detector's labelled scenarios so the online detector sees realistic shapes and finds phases) and one
action batch of `actions` records (`source="loss"`). Both bodies use the real wire format
(`contracts.wire`), uncompressed JSON: gzip is the trainer's CPU, not the service's, and on a 2-core
machine the client shares the cores with the server under test.

Even runs follow `collapse_scenario(seed)` (held at their last value past its end), odd runs
`healthy_scenario(seed)`, so phase changes (and alerts) happen while the benchmark streams.
"""

from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass

import numpy as np
import orjson

from contracts import metrics as M
from contracts.wire import encode_float
from lldmon_lab.scenarios import collapse_scenario, healthy_scenario

# Canonical metrics the scenarios do not generate: the LLDS state a trainer reports (off) and the
# metrics without a scenario shape, as slow AR-free noise around a plausible level.
_EXTRA_LEVELS: dict[str, tuple[float, float]] = {
    M.LLDS_ACTIVE: (0.0, 0.0),
    M.LLDS_LAMBDA: (0.0, 0.0),
    M.LLDS_LOSS: (0.0, 0.0),
    M.LLDS_GATED_ACTION_FRAC: (0.0, 0.0),
    M.RATIO_POS_MIN: (0.7, 0.05),
    M.ADV_POS_NEG_MASS_RATIO: (1.0, 0.1),
    M.ADV_POS_NEG_MASS_RATIO_ANSWER: (1.0, 0.2),
    M.LOSS: (0.05, 0.02),
    M.KL_REF: (0.01, 0.002),
    M.LOGP_CORRECT: (-0.4, 0.05),
    M.DELTA_TRAJ_CORRECT: (0.0, 0.05),
    M.FRAC_TRAJ_DECREASED_CORRECT: (0.3, 0.05),
    M.XMB_DELTA_TRAJ_POS: (0.0, 0.05),
    M.XMB_DELTA_TRAJ_NEG: (-0.05, 0.05),
    M.XMB_DELTA_ACTION_POS: (0.0, 0.02),
    M.XMB_FRAC_TRAJ_DECREASED_POS: (0.3, 0.05),
    M.XMB_FRAC_ACTION_DECREASED_POS: (0.3, 0.05),
    M.XMB_DELTA_TRAJ_CORRECT: (0.0, 0.05),
    M.XMB_FRAC_TRAJ_DECREASED_CORRECT: (0.3, 0.05),
    M.ANCHOR_LOGP: (-0.4, 0.02),
    M.ANCHOR_DELTA: (0.0, 0.01),
    M.ANCHOR_FRAC_DECREASED: (0.3, 0.05),
    M.ANCHOR_SIZE: (32.0, 0.0),
    M.ACTION_VALID_RATIO: (0.95, 0.02),
}


@dataclass(frozen=True)
class SimRun:
    """One simulated run: `values[name][step]` (None = not logged) and a pre-encoded action template."""

    name: str
    kind: str
    values: dict[str, list[float | str | None]]
    actions_tail: bytes
    actions: int

    @property
    def n_steps(self) -> int:
        return len(next(iter(self.values.values())))

    def metric_rows(self, step: int) -> int:
        return sum(column[step] is not None for column in self.values.values())

    def metrics_body(self, steps: range) -> bytes:
        """Metrics batch for `steps` (one id per call: a retry would reuse the body)."""
        return orjson.dumps(
            {
                "batch_id": uuid.uuid4().hex,
                "steps": list(steps),
                "metrics": {name: column[steps.start : steps.stop] for name, column in self.values.items()},
            }
        )

    def actions_body(self, step: int) -> bytes:
        """Action batch of step `step`: only `batch_id` and the `step` column change between steps."""
        head = b'{"batch_id":"%s","step":[%s]' % (
            uuid.uuid4().hex.encode(),
            b",".join([str(step).encode()] * self.actions),
        )
        return head + self.actions_tail

    def combined_body(self, step: int) -> bytes:
        """Step `step`'s metrics and action batches as one `/combined` body, as the hooks send a step."""
        return b'{"metrics":%s,"actions":%s}' % (
            self.metrics_body(range(step, step + 1)),
            self.actions_body(step),
        )


def _series(index: int, n_steps: int) -> tuple[str, dict[str, list[float | str | None]]]:
    scenario = collapse_scenario(index) if index % 2 == 0 else healthy_scenario(index, n_steps=n_steps)
    out: dict[str, list[float | str | None]] = {}
    for name in M.CANONICAL_METRICS:
        if name in scenario.values:
            raw, present = scenario.values[name], scenario.present[name]
            if len(raw) < n_steps:  # hold the last state past the scenario's end
                pad = n_steps - len(raw)
                raw = np.concatenate([raw, np.repeat(raw[-1:], pad)])
                present = np.concatenate([present, np.repeat(present[-1:], pad)])
            out[name] = [
                encode_float(float(v)) if p else None
                for v, p in zip(raw[:n_steps], present[:n_steps], strict=True)
            ]
        else:  # a KeyError here: a new canonical metric needs a level above
            level, sd = _EXTRA_LEVELS[name]
            rng = np.random.default_rng(zlib.crc32(name.encode()) + index)
            out[name] = [float(level + sd * x) for x in rng.standard_normal(n_steps)]
    return scenario.kind, out


def search_r1_actions(n: int, seed: int) -> dict[str, np.ndarray]:
    """One step's `n` action records shaped like Search-R1 with lldmon's hooks, as numpy columns.

    Trajectories of 1-7 actions (about 4 on average: search calls then the answer, the last action of
    a trajectory is the answer), sorted by (traj_index, action_index); advantage and reward constant
    within a trajectory (GRPO's group-normalised advantage, exact-match reward 1 where it is positive).
    Float columns are float32 *values* held in float64: the hooks compute in float32 and send
    `tensor.tolist()`, whose doubles are exactly float32 numbers, so a store may keep them as float32
    without loss. Rounded decimals (0.12345) would not be float32-exact and would misrepresent the data
    a columnar store gets (and what it can save). Never JSON-encode the float32 arrays themselves:
    orjson writes a float32 by its shortest float32 repr, which parses back to a different double.
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 8, size=max(n, 1))  # mean 4
    ends = np.cumsum(lengths)
    k = int(np.searchsorted(ends, n)) + 1 if n > 0 else 0
    lengths = lengths[:k].copy()
    if k:
        lengths[-1] -= int(ends[k - 1]) - n  # the last trajectory ends at record n
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)  # first record of each record's trajectory
    traj_index = np.repeat(np.arange(k, dtype=np.int64), lengths)
    action_index = np.arange(n, dtype=np.int64) - starts
    advantage = rng.standard_normal(k).astype(np.float32)
    return {
        "traj_index": traj_index,
        "action_index": action_index,
        "n_tokens": rng.integers(20, 120, n),
        "delta": rng.normal(-0.02, 0.3, n).astype(np.float32).astype(np.float64),
        "old_logp_mean": (-rng.uniform(0.05, 2.5, n)).astype(np.float32).astype(np.float64),
        "advantage": np.repeat(advantage, lengths).astype(np.float64),
        "reward": np.repeat((advantage > 0).astype(np.float64), lengths),
        "is_answer": action_index == np.repeat(lengths - 1, lengths),
    }


def actions_json(columns: dict[str, np.ndarray]) -> dict[str, list[int] | list[float] | list[bool]]:
    """Numpy action columns as the JSON lists the hooks send (`.tolist()`: exact doubles, plain ints)."""
    return {name: column.tolist() for name, column in columns.items()}


def _actions_tail(index: int, n: int) -> bytes:
    """All action columns but `batch_id` and `step`, JSON-encoded once per run."""
    body = orjson.dumps(actions_json(search_r1_actions(n, 10_000 + index)) | {"source": ["loss"] * n})
    return b"," + body[1:]  # '{"traj_index":...}' -> ',"traj_index":...}'


def make_runs(n_runs: int, n_steps: int, actions: int, prefix: str = "sim") -> list[SimRun]:
    """`n_runs` runs of `n_steps` steps each, deterministic for a given (index, n_steps)."""
    if n_runs < 1 or n_steps < 1 or actions < 0:
        raise ValueError(f"need n_runs >= 1, n_steps >= 1, actions >= 0; got {n_runs}, {n_steps}, {actions}")
    runs = []
    for i in range(n_runs):
        kind, values = _series(i, n_steps)
        runs.append(SimRun(f"{prefix}-{i:03d}", kind, values, _actions_tail(i, actions), actions))
    return runs
