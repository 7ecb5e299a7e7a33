"""Synthetic GRPO runs with known labels, for tuning and testing the detector.

Collapse runs follow the phase shapes of [LLD] Fig. 2-4 (docs/science.md section 3), with randomised
onsets, scales and noise:
- phase I (to ~60): correct-response log-likelihood `lld/logp_pos` flat, reward rising, grad norm stable,
  entropy rising slowly; ~25-40 % of correct responses lose likelihood over an update (noise).
- phase II (~60-120): `lld/logp_pos` declines slowly and steadily, the share of correct responses losing
  likelihood creeps up and their mean D_traj turns negative; reward still rising; grad norm stable.
- phase III (after ~120): accelerating likelihood drop, grad-norm explosion and entropy surge; the reward
  turns down, then goes to 0; > 50 % of correct samples lose likelihood; response length stays flat;
  incorrect responses sit below correct ones after ~step 80.
Onsets: decay U[45, 80], collapse = decay + U[45, 75], reward turn-down 0-8 steps after the collapse onset,
surges start 0-6 steps after it. The label is the one collapse rule of every lldmon number
(`labels.collapse_step`: the reward's 10-step trailing mean stays below 20 % of its running peak).

Controls: healthy runs (reward rises and saturates, entropy decays smoothly, likelihood of correct
responses rises, isolated grad-norm spikes of up to 40x and spike clusters like the verl GSM8K Qwen log;
every second one with a population shift: `lld/logp_pos` falls while the anchor set holds)
and noisy-stagnant runs (small batches as in the Search-R1 logs: flat noisy reward with many zero-score
steps, idle steps with grad norm ~0, 40-75 % zero-std groups as in the TRL FinQA log, isolated spikes).
Every scenario exists with the hook metrics and without them (degraded: what an imported log holds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final, Literal

import numpy as np

from contracts import metrics as M
from lldmon_lab.labels import collapse_step
from monitor.detector.stats import FloatArray, IntArray
from monitor.detector.types import BoolArray

Kind = Literal["collapse", "healthy", "noisy_stagnant"]

HOOK_ONLY_METRICS: Final = (
    *M.LLD_METRICS,
    M.RATIO_POS_MEAN,
    M.RATIO_POS_MIN,
    M.RATIO_POS_FRAC_LOW,
    M.ADV_POS_NEG_MASS_RATIO,
    M.GARBLED_FRAC,
)
"""Metrics only lldmon's trainer hooks produce: removed in the degraded (imported-log) variants."""


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: Kind
    hooks: bool
    seed: int
    steps: IntArray
    values: dict[str, FloatArray]
    present: dict[str, BoolArray]
    collapse_step: int | None
    """Label: `labels.collapse_step` of the reward (None for controls)."""
    onsets: dict[str, int] = field(default_factory=dict)
    """Generating phase onsets ("decay", "collapse") of collapse runs."""

    @property
    def collapses(self) -> bool:
        return self.collapse_step is not None

    def without_hooks(self) -> Scenario:
        """The same run as an imported trainer log would show it (no hook metrics)."""
        keep = [k for k in self.values if k not in HOOK_ONLY_METRICS]
        return replace(
            self,
            name=self.name.replace("+hooks", "") + "-degraded",
            hooks=False,
            values={k: self.values[k] for k in keep},
            present={k: self.present[k] for k in keep},
        )


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> FloatArray:
    """AR(1) noise with stationary standard deviation `sd` (autocorrelated wander, as in real series)."""
    eps = rng.normal(0.0, sd * math.sqrt(1 - phi * phi), n)
    out = np.empty(n)
    prev = rng.normal(0.0, sd)
    for i in range(n):
        prev = phi * prev + eps[i]
        out[i] = prev
    return out


def _spikes(rng: np.random.Generator, n: int, prob: float, low: float, high: float) -> FloatArray:
    """Multiplicative isolated spikes."""
    mult = np.ones(n)
    hit = rng.random(n) < prob
    mult[hit] = rng.uniform(low, high, int(hit.sum()))
    return mult


def _likelihood_views(
    rng: np.random.Generator, clean: FloatArray, noisy: FloatArray, every: int = 5
) -> dict[str, FloatArray]:
    """`lld/logp_correct` (the reward-defined correct population: the batch's own noise) and the anchor
    set's `lld/anchor/logp` (fixed responses re-scored every `every` steps: the clean curve plus a little
    noise, NaN between scorings) of a run whose correct-response likelihood follows `clean`."""
    n = clean.size
    anchor = np.full(n, np.nan)
    idx = np.arange(0, n, every)
    anchor[idx] = clean[idx] + rng.normal(0, 0.01, idx.size)
    return {M.LOGP_CORRECT: noisy + rng.normal(0, 0.005, n), M.ANCHOR_LOGP: anchor}


def _finish(
    name: str,
    kind: Kind,
    seed: int,
    values: dict[str, FloatArray],
    collapse_step: int | None,
    onsets: dict[str, int],
    absent: dict[str, BoolArray] | None = None,
) -> Scenario:
    n = next(iter(values.values())).size
    steps = np.arange(n, dtype=np.int64)
    present = {k: np.ones(n, dtype=np.bool_) for k in values}
    if M.ANCHOR_LOGP in values:  # scored every few steps only
        present[M.ANCHOR_LOGP] = ~np.isnan(values[M.ANCHOR_LOGP])
    for k, mask in (absent or {}).items():
        values[k] = values[k].copy()
        values[k][mask] = np.nan
        present[k] = ~mask
    return Scenario(name, kind, True, seed, steps, values, present, collapse_step, onsets)


def collapse_scenario(seed: int) -> Scenario:
    """A GRPO run that goes through phases I-III and collapses (with hook metrics)."""
    rng = np.random.default_rng(seed)
    t1 = int(rng.integers(45, 81))
    t2 = t1 + int(rng.integers(45, 76))
    turn = t2 + int(rng.integers(0, 9))
    width = float(rng.uniform(8, 25))
    n = int(turn + 2.5 * width + rng.integers(25, 60))
    t = np.arange(n, dtype=np.float64)
    after2 = np.maximum(t - t2, 0.0)
    in2 = np.clip((t - t1) / (t2 - t1), 0.0, 1.0)

    # reward: saturating rise, turns down after `turn`, then to 0
    r0, rmax, tau = rng.uniform(0.05, 0.25), rng.uniform(0.5, 0.8), rng.uniform(30, 70)
    decline = np.exp(-((np.maximum(t - turn, 0.0) / width) ** 2))
    reward_clean = (r0 + (rmax - r0) * (1 - np.exp(-t / tau))) * decline
    reward = np.clip(reward_clean + rng.normal(0, rng.uniform(0.01, 0.03), n), 0.0, 1.0)

    # grad norm: stable log-normal, isolated spikes, explosion in phase III
    g0 = math.exp(rng.uniform(math.log(0.2), math.log(3.0)))
    g_start = t2 + int(rng.integers(0, 7))
    g_growth = np.minimum(np.exp(np.maximum(t - g_start, 0.0) / rng.uniform(3, 8)), rng.uniform(10, 200))
    grad = (
        g0
        * np.exp(rng.normal(0, rng.uniform(0.1, 0.25), n))
        * _spikes(rng, n, rng.uniform(0.005, 0.02), 3, 30)
    )
    grad = grad * g_growth

    # entropy: slow rise, surge in phase III
    e0 = rng.uniform(0.3, 0.9)
    e_start = t2 + int(rng.integers(0, 7))
    e_growth = np.minimum(np.exp(np.maximum(t - e_start, 0.0) / rng.uniform(5, 15)), rng.uniform(2, 5))
    entropy = e0 * (1 + rng.uniform(0, 0.002) * np.minimum(t, t2)) * e_growth
    entropy = entropy * (1 + rng.normal(0, rng.uniform(0.02, 0.05), n))

    # likelihood of correct responses: flat, slow decline, accelerating drop
    l0 = rng.uniform(-0.5, -0.15)
    s1, s2 = rng.uniform(-0.0002, 0.0003), -rng.uniform(0.0015, 0.004)
    sigma_l = rng.uniform(0.005, 0.02)
    logp = l0 + s1 * np.minimum(t, t1) + s2 * np.clip(t - t1, 0, None)
    logp = logp - rng.uniform(0.02, 0.06) * (np.exp(after2 / rng.uniform(5, 12)) - 1)
    logp_clean = np.maximum(logp, -8.0)
    logp = logp_clean + rng.normal(0, sigma_l, n) + _ar1(rng, n, rng.uniform(0.3, 0.7), sigma_l / 2)
    gap = 0.05 + 0.25 / (1 + np.exp(-(t - 80) / 10))
    logp_neg = logp - gap + rng.normal(0, sigma_l, n)

    f0 = rng.uniform(0.25, 0.4)
    f_t2 = f0 + rng.uniform(0.06, 0.15)
    frac = f0 + (f_t2 - f0) * in2 + (rng.uniform(0.6, 0.9) - f_t2) * (1 - np.exp(-after2 / 8))
    frac = np.clip(frac + rng.normal(0, rng.uniform(0.02, 0.04), n), 0, 1)
    frac_action = np.clip(frac + 0.05 + rng.normal(0, 0.02, n), 0, 1)
    d0, d_end = rng.uniform(0.02, 0.08), -rng.uniform(0.005, 0.03)
    delta = d0 + (d_end - d0) * in2 - rng.uniform(0.2, 1.0) * (1 - np.exp(-after2 / 10))
    delta = delta + rng.normal(0, rng.uniform(0.01, 0.02), n)

    k0 = rng.uniform(0.001, 0.005)
    kl = k0 * np.minimum(g_growth, rng.uniform(20, 200)) * (1 + rng.normal(0, 0.2, n))
    values: dict[str, FloatArray] = {
        M.REWARD_MEAN: reward,
        M.REWARD_STD: np.sqrt(np.clip(reward * (1 - reward), 0, None)) * 0.9,
        M.GRAD_NORM: grad,
        M.ENTROPY_MEAN: entropy,
        M.LOSS: rng.normal(0, 0.02, n) * np.sqrt(g_growth),
        M.KL_OLD: kl,  # old -> new policy (verl actor/ppo_kl): grows with the gradient
        M.CLIP_FRAC: rng.uniform(0.001, 0.005) * np.minimum(g_growth, 10) * (1 + rng.normal(0, 0.2, n)),
        M.RESPONSE_LENGTH_MEAN: rng.uniform(150, 500) * (1 + rng.normal(0, 0.03, n)),
        M.RESPONSE_CLIP_RATIO: np.clip(rng.uniform(0, 0.05) + rng.normal(0, 0.01, n), 0, 1),
        M.SEARCH_VALID_PER_TRAJ: rng.uniform(1, 2.5) + rng.normal(0, 0.05, n),
        M.ADV_FRAC_ZERO_STD_GROUPS: np.clip(
            1 - (1 - rng.uniform(0.05, 0.3)) * decline + rng.normal(0, 0.03, n), 0, 1
        ),
        M.LOGP_POS: logp,
        M.LOGP_NEG: logp_neg,
        M.DELTA_TRAJ_POS: delta,
        M.DELTA_ACTION_POS: delta / 3 + rng.normal(0, 0.005, n),
        M.DELTA_TRAJ_NEG: -rng.uniform(0.05, 0.15) * (1 + after2 / 10) + rng.normal(0, 0.02, n),
        M.FRAC_TRAJ_DECREASED_POS: frac,
        M.FRAC_ACTION_DECREASED_POS: frac_action,
        M.RATIO_POS_MEAN: 1 - 0.2 * (1 - np.exp(-after2 / 15)) + rng.normal(0, 0.005, n),
        M.RATIO_POS_FRAC_LOW: np.clip(0.02 + 0.3 * (1 - np.exp(-after2 / 15)) + rng.normal(0, 0.01, n), 0, 1),
        M.GARBLED_FRAC: np.clip(0.01 + rng.uniform(0.1, 0.6) * (1 - decline) + rng.normal(0, 0.01, n), 0, 1),
        **_likelihood_views(rng, logp_clean, logp),
    }
    values[M.TURNS_MEAN] = values[M.SEARCH_VALID_PER_TRAJ] + 1
    absent: dict[str, BoolArray] = {}
    if rng.random() < 0.3:  # some runs end with NaN gradients
        label_guess = int(turn + width)
        nan_at = min(n - 1, label_guess + int(rng.integers(10, 30)))
        values[M.GRAD_NORM][nan_at:] = np.nan
        values[M.LOSS][nan_at:] = np.nan
    label = collapse_step(np.arange(n), reward)
    return _finish(
        f"collapse-{seed}+hooks", "collapse", seed, values, label, {"decay": t1, "collapse": t2}, absent
    )


def healthy_scenario(seed: int, n_steps: int | None = None, population_shift: bool = False) -> Scenario:
    """A run that learns and saturates without collapsing (with hook metrics); 250-450 steps unless
    `n_steps` is given (the cost benchmark uses 10k). `population_shift`: `lld/logp_pos` falls by 0.15-0.4
    as easy groups leave the A > 0 population, while the anchor set and the correct population hold
    their likelihood (a control that must stay healthy)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(250, 451))
    if n_steps is not None:
        n = n_steps
    t = np.arange(n, dtype=np.float64)
    r0, rmax, tau = rng.uniform(0.05, 0.4), rng.uniform(0.55, 0.85), rng.uniform(20, 80)
    reward = np.clip(
        r0 + (rmax - r0) * (1 - np.exp(-t / tau)) + rng.normal(0, rng.uniform(0.01, 0.03), n), 0, 1
    )
    g0 = math.exp(rng.uniform(math.log(0.2), math.log(3.0)))
    grad = g0 * np.exp(rng.normal(0, rng.uniform(0.05, 0.25), n))
    grad = grad * _spikes(rng, n, rng.uniform(0.005, 0.03), 3, 40)
    if rng.random() < 0.5:  # a cluster of moderate spikes (verl GSM8K Qwen, steps 25-90)
        start = int(rng.integers(20, max(21, n - 60)))
        cluster = _spikes(rng, 60, 0.35, 2, 8)
        grad[start : start + 60] *= cluster[: grad[start : start + 60].size]
    e0 = rng.uniform(0.3, 0.9)
    floor_share = rng.uniform(0.15, 0.6)
    entropy = e0 * (floor_share + (1 - floor_share) * np.exp(-t / rng.uniform(30, 120)))
    entropy = entropy * (1 + rng.normal(0, rng.uniform(0.02, 0.05), n))
    sigma_l = rng.uniform(0.005, 0.02)
    logp_clean = rng.uniform(-0.6, -0.2) + rng.uniform(0.02, 0.2) * (1 - np.exp(-t / rng.uniform(30, 120)))
    logp = logp_clean + rng.normal(0, sigma_l, n) + _ar1(rng, n, rng.uniform(0.3, 0.7), sigma_l / 2)
    views = _likelihood_views(rng, logp_clean, logp)
    shift = population_shift
    if shift:
        # easy groups leave the A > 0 population as they are solved: its mean log-prob falls although no
        # response loses likelihood (the anchor set and the correct population stay put)
        logp = logp - rng.uniform(0.15, 0.4) * (1 - np.exp(-t / rng.uniform(40, 100)))
    frac = np.clip(rng.uniform(0.2, 0.4) + rng.normal(0, rng.uniform(0.02, 0.04), n), 0, 1)
    delta = rng.uniform(0.01, 0.06) + rng.normal(0, rng.uniform(0.01, 0.02), n)
    values = _common(rng, n, reward, grad, entropy)
    values.update(
        {
            M.LOGP_POS: logp,
            M.LOGP_NEG: logp - 0.1 - 0.2 * (1 - np.exp(-t / 80)) + rng.normal(0, sigma_l, n),
            M.DELTA_TRAJ_POS: delta,
            M.DELTA_ACTION_POS: delta / 3 + rng.normal(0, 0.005, n),
            M.DELTA_TRAJ_NEG: -rng.uniform(0.05, 0.15) + rng.normal(0, 0.02, n),
            M.FRAC_TRAJ_DECREASED_POS: frac,
            M.FRAC_ACTION_DECREASED_POS: np.clip(frac + 0.05 + rng.normal(0, 0.02, n), 0, 1),
            **views,
        }
    )
    name = f"{'population-shift' if shift else 'healthy'}-{seed}+hooks"
    return _finish(name, "healthy", seed, values, None, {})


def noisy_stagnant_scenario(seed: int) -> Scenario:
    """A small-batch run that does not learn (Search-R1 / TRL FinQA logs): very noisy, flat, with idle
    steps and isolated grad-norm spikes (with hook metrics; absent on steps without correct responses)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(250, 501))
    batch = int(rng.integers(8, 33))
    p = np.clip(rng.uniform(0.15, 0.5) + _ar1(rng, n, 0.9, 0.05), 0.02, 0.98)
    reward = rng.binomial(batch, p).astype(np.float64) / batch
    zero_std = np.clip(rng.uniform(0.4, 0.75) + rng.normal(0, 0.12, n), 0, 1)
    idle = rng.random(n) < rng.uniform(0.05, 0.3)
    g0 = math.exp(rng.uniform(math.log(0.2), math.log(2.0)))
    grad = (
        g0 * np.exp(rng.normal(0, rng.uniform(0.3, 0.6), n)) * _spikes(rng, n, rng.uniform(0.01, 0.03), 3, 15)
    )
    grad[idle] = rng.uniform(0.0, 0.003, int(idle.sum()))
    zero_std[idle] = 1.0
    entropy = rng.uniform(0.3, 0.9) * np.exp(
        _ar1(rng, n, 0.8, 0.1) + rng.normal(0, rng.uniform(0.1, 0.25), n)
    )
    values = _common(rng, n, reward, grad, entropy)
    values[M.ADV_FRAC_ZERO_STD_GROUPS] = zero_std
    values[M.RESPONSE_LENGTH_MEAN] = values[M.RESPONSE_LENGTH_MEAN] * (1 + rng.normal(0, 0.12, n))
    sigma_l = rng.uniform(0.02, 0.05)
    level = rng.uniform(-0.6, -0.2)
    logp = level + rng.normal(0, sigma_l, n) + _ar1(rng, n, rng.uniform(0.3, 0.8), sigma_l / 2)
    frac = np.clip(rng.uniform(0.3, 0.5) + rng.normal(0, 0.08, n), 0, 1)
    delta = rng.uniform(-0.01, 0.03) + rng.normal(0, 0.03, n)
    values.update(
        {
            M.LOGP_POS: logp,
            M.LOGP_NEG: logp - 0.1 + rng.normal(0, sigma_l, n),
            M.DELTA_TRAJ_POS: delta,
            M.DELTA_ACTION_POS: delta / 3 + rng.normal(0, 0.01, n),
            M.DELTA_TRAJ_NEG: -rng.uniform(0.0, 0.1) + rng.normal(0, 0.03, n),
            M.FRAC_TRAJ_DECREASED_POS: frac,
            M.FRAC_ACTION_DECREASED_POS: np.clip(frac + rng.normal(0, 0.05, n), 0, 1),
            **_likelihood_views(rng, np.full(n, level), logp),
        }
    )
    no_correct = reward == 0  # no A>0 responses: the hooks log nothing for them
    absent = {
        k: no_correct
        for k in (
            M.LOGP_POS,
            M.DELTA_TRAJ_POS,
            M.DELTA_ACTION_POS,
            M.FRAC_TRAJ_DECREASED_POS,
            M.FRAC_ACTION_DECREASED_POS,
            M.LOGP_CORRECT,
        )
    }
    return _finish(f"noisy-stagnant-{seed}+hooks", "noisy_stagnant", seed, values, None, {}, absent)


def _common(
    rng: np.random.Generator, n: int, reward: FloatArray, grad: FloatArray, entropy: FloatArray
) -> dict[str, FloatArray]:
    """Metrics that behave alike in the control runs."""
    return {
        M.REWARD_MEAN: reward,
        M.REWARD_STD: np.sqrt(np.clip(reward * (1 - reward), 0, None)) * 0.9,
        M.GRAD_NORM: grad,
        M.ENTROPY_MEAN: entropy,
        M.LOSS: rng.normal(0, 0.02, n),
        M.KL_OLD: np.abs(rng.uniform(0.001, 0.005) * (1 + rng.normal(0, 0.3, n))),
        M.CLIP_FRAC: np.abs(rng.uniform(0.001, 0.005) * (1 + rng.normal(0, 0.3, n))),
        M.RESPONSE_LENGTH_MEAN: rng.uniform(100, 500)
        * (1 + rng.normal(0, 0.03, n) + 0.1 * np.sin(np.arange(n) / 60)),
        M.RESPONSE_CLIP_RATIO: np.clip(rng.uniform(0, 0.08) + rng.normal(0, 0.02, n), 0, 1),
        M.SEARCH_VALID_PER_TRAJ: rng.uniform(1, 2.5) + rng.normal(0, 0.05, n),
        M.TURNS_MEAN: rng.uniform(2, 3.5) + rng.normal(0, 0.05, n),
        M.ADV_FRAC_ZERO_STD_GROUPS: np.clip(rng.uniform(0.05, 0.3) + rng.normal(0, 0.03, n), 0, 1),
        M.RATIO_POS_MEAN: 1 + rng.normal(0, 0.005, n),
        M.RATIO_POS_FRAC_LOW: np.clip(0.02 + rng.normal(0, 0.01, n), 0, 1),
        M.GARBLED_FRAC: np.clip(0.01 + rng.normal(0, 0.005, n), 0, 1),
    }


def scenario_suite(
    n_collapse: int = 20, n_controls: int = 10, seed: int = 0, degraded: bool = True
) -> list[Scenario]:
    """`n_collapse` collapse runs, `n_controls` healthy and `n_controls` noisy-stagnant runs, each with
    hook metrics and (if `degraded`) again without them. Seeds are derived from `seed`."""
    base = np.random.default_rng(seed).integers(0, 2**31 - 1, size=n_collapse + 2 * n_controls)
    runs: list[Scenario] = [collapse_scenario(int(s)) for s in base[:n_collapse]]
    controls = base[n_collapse : n_collapse + n_controls]
    runs += [healthy_scenario(int(s), population_shift=i % 2 == 1) for i, s in enumerate(controls)]
    runs += [noisy_stagnant_scenario(int(s)) for s in base[n_collapse + n_controls :]]
    if degraded:
        runs += [r.without_hooks() for r in list(runs)]
    return runs
