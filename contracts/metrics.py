"""Canonical metric names: the one vocabulary of hooks, service, database, dashboard and importers.

Sign conventions follow docs/science.md section 2: D = log pi_new - log pi_old, so D < 0 means
the likelihood of a token/action/trajectory *fell*.

One quantity, one name (docs/science.md section 2, "Estimators and populations"):

- `lld/delta_*`, `lld/frac_*_decreased_*`: only the exact delta of Def. 4.1, the same rows scored
  right before and right after an optimizer step (a post-update probe).
- `lld/xmb/*`: cross-mini-batch drift seen inside the loss (rows scored after updates on *other*
  rows of their rollout batch): free, but a proxy of the above.
- `lld/logp_*`: level at rollout time (mean per-token log-prob under the rollout policy).
- `lld/anchor/*`: a frozen set of correct responses re-scored every N steps.

Populations: "pos"/"neg" = advantage A > 0 / A < 0 (what the loss pushes up/down); "correct" = reward
at or above the task's success threshold (what [LLD] calls correct; it cannot shift as groups
become all-correct and leave "pos").
"""

from __future__ import annotations

import re
from typing import Final

# --- likelihood displacement (docs/science.md section 2) ---
LOGP_POS: Final = "lld/logp_pos"
"""Mean per-token log-prob under the rollout (old) policy of A>0 responses, action tokens only."""
LOGP_NEG: Final = "lld/logp_neg"
"""Mean per-token log-prob under the rollout (old) policy of A<0 responses, action tokens only."""
DELTA_TRAJ_POS: Final = "lld/delta_traj_pos"
"""Mean trajectory delta D_traj = sum(new - old) over A>0 responses."""
DELTA_TRAJ_NEG: Final = "lld/delta_traj_neg"
"""Mean trajectory delta D_traj over A<0 responses."""
DELTA_ACTION_POS: Final = "lld/delta_action_pos"
"""Mean action delta D_action over the actions of A>0 responses."""
FRAC_TRAJ_DECREASED_POS: Final = "lld/frac_traj_decreased_pos"
"""Share of A>0 responses whose D_traj < eps."""
FRAC_ACTION_DECREASED_POS: Final = "lld/frac_action_decreased_pos"
"""Share of actions of A>0 responses whose D_action < eps."""

# reward-defined population ("correct": reward >= success threshold)
LOGP_CORRECT: Final = "lld/logp_correct"
"""Mean per-token log-prob under the rollout policy of correct responses, action tokens only."""
DELTA_TRAJ_CORRECT: Final = "lld/delta_traj_correct"
"""Exact mean D_traj over correct responses (probe)."""
FRAC_TRAJ_DECREASED_CORRECT: Final = "lld/frac_traj_decreased_correct"
"""Exact share of correct responses whose D_traj < eps (probe)."""

# cross-mini-batch drift inside the loss: a proxy, never published under the exact names
XMB_DELTA_TRAJ_POS: Final = "lld/xmb/delta_traj_pos"
XMB_DELTA_TRAJ_NEG: Final = "lld/xmb/delta_traj_neg"
XMB_DELTA_ACTION_POS: Final = "lld/xmb/delta_action_pos"
XMB_FRAC_TRAJ_DECREASED_POS: Final = "lld/xmb/frac_traj_decreased_pos"
XMB_FRAC_ACTION_DECREASED_POS: Final = "lld/xmb/frac_action_decreased_pos"
XMB_DELTA_TRAJ_CORRECT: Final = "lld/xmb/delta_traj_correct"
XMB_FRAC_TRAJ_DECREASED_CORRECT: Final = "lld/xmb/frac_traj_decreased_correct"

EXACT_TO_XMB: Final = {
    DELTA_TRAJ_POS: XMB_DELTA_TRAJ_POS,
    DELTA_TRAJ_NEG: XMB_DELTA_TRAJ_NEG,
    DELTA_ACTION_POS: XMB_DELTA_ACTION_POS,
    FRAC_TRAJ_DECREASED_POS: XMB_FRAC_TRAJ_DECREASED_POS,
    FRAC_ACTION_DECREASED_POS: XMB_FRAC_ACTION_DECREASED_POS,
    DELTA_TRAJ_CORRECT: XMB_DELTA_TRAJ_CORRECT,
    FRAC_TRAJ_DECREASED_CORRECT: XMB_FRAC_TRAJ_DECREASED_CORRECT,
}
"""Exact-delta name -> its cross-mini-batch proxy name (what an in-loss measurement publishes)."""

# anchor set: K correct responses frozen when first seen, re-scored every N steps
ANCHOR_LOGP: Final = "lld/anchor/logp"
"""Mean per-token log-prob of the anchor responses under the current policy ([LLD] Fig. 2 on a fixed set)."""
ANCHOR_DELTA: Final = "lld/anchor/delta"
"""Mean per-token change of that log-prob since each anchor was captured (< 0: likelihood fell)."""
ANCHOR_FRAC_DECREASED: Final = "lld/anchor/frac_decreased"
"""Share of anchors whose trajectory log-likelihood is below its value at capture (D_traj < eps)."""
ANCHOR_SIZE: Final = "lld/anchor/size"
"""Number of anchors re-scored (grows to K as correct responses appear, then stays)."""

# --- optimisation health ---
ENTROPY_MEAN: Final = "entropy/mean"
GRAD_NORM: Final = "grad/norm"
"""Gradient norm before clipping."""
LOSS: Final = "loss"
KL_REF: Final = "kl/ref"
"""KL to the reference policy (TRL `kl`, verl `actor/kl_loss`, or `actor/reward_kl_penalty` with the KL in
the reward)."""
KL_OLD: Final = "kl/old"
"""KL from the rollout (old) policy to the updated one (verl `actor/ppo_kl`)."""
CLIP_FRAC: Final = "clip/frac"

# --- rollouts ---
REWARD_MEAN: Final = "reward/mean"
REWARD_STD: Final = "reward/std"
RESPONSE_LENGTH_MEAN: Final = "response/length_mean"
RESPONSE_CLIP_RATIO: Final = "response/clip_ratio"
SEARCH_VALID_PER_TRAJ: Final = "search/valid_per_traj"
ACTION_VALID_RATIO: Final = "action/valid_ratio"
"""Share of the agent's actions (tool calls, environment actions) that were valid (verl-agent's
`episode/valid_action_ratio`); its fall is an invalid-action surge."""
TURNS_MEAN: Final = "turns/mean"

# --- importance ratios on A>0 tokens (SAPO's drift signature, docs/science.md section 5) ---
RATIO_POS_MEAN: Final = "ratio/pos_mean"
RATIO_POS_MIN: Final = "ratio/pos_min"
RATIO_POS_FRAC_LOW: Final = "ratio/pos_frac_low"

# --- advantages (CalibAdv diagnostics) ---
ADV_POS_NEG_MASS_RATIO: Final = "adv/pos_neg_mass_ratio"
"""[CalibAdv]: sum of A over A > 0 loss tokens / |sum of A over A < 0 loss tokens| (per token, not
per response: per response it is identically 1 in GRPO)."""
ADV_POS_NEG_MASS_RATIO_ANSWER: Final = "adv/pos_neg_mass_ratio_answer"
"""The same over answer-span tokens only (the final `<answer>...</answer>`)."""
ADV_FRAC_ZERO_STD_GROUPS: Final = "adv/frac_zero_std_groups"
GARBLED_FRAC: Final = "garbled/frac"

# --- LLDS state reported by the trainer ---
LLDS_ACTIVE: Final = "llds/active"
LLDS_LAMBDA: Final = "llds/lambda"
LLDS_LOSS: Final = "llds/loss"
LLDS_GATED_ACTION_FRAC: Final = "llds/gated_action_frac"

LLD_METRICS: Final = (
    LOGP_POS,
    LOGP_NEG,
    DELTA_TRAJ_POS,
    DELTA_TRAJ_NEG,
    DELTA_ACTION_POS,
    FRAC_TRAJ_DECREASED_POS,
    FRAC_ACTION_DECREASED_POS,
    LOGP_CORRECT,
    DELTA_TRAJ_CORRECT,
    FRAC_TRAJ_DECREASED_CORRECT,
    *EXACT_TO_XMB.values(),
    ANCHOR_LOGP,
    ANCHOR_DELTA,
    ANCHOR_FRAC_DECREASED,
    ANCHOR_SIZE,
)
"""Metrics only the hooks can produce; imported logs usually lack them (degraded mode)."""

CANONICAL_METRICS: Final = (
    *LLD_METRICS,
    ENTROPY_MEAN,
    GRAD_NORM,
    LOSS,
    KL_REF,
    KL_OLD,
    CLIP_FRAC,
    REWARD_MEAN,
    REWARD_STD,
    RESPONSE_LENGTH_MEAN,
    RESPONSE_CLIP_RATIO,
    SEARCH_VALID_PER_TRAJ,
    ACTION_VALID_RATIO,
    TURNS_MEAN,
    RATIO_POS_MEAN,
    RATIO_POS_MIN,
    RATIO_POS_FRAC_LOW,
    ADV_POS_NEG_MASS_RATIO,
    ADV_POS_NEG_MASS_RATIO_ANSWER,
    ADV_FRAC_ZERO_STD_GROUPS,
    GARBLED_FRAC,
    LLDS_ACTIVE,
    LLDS_LAMBDA,
    LLDS_LOSS,
    LLDS_GATED_ACTION_FRAC,
)

MAX_METRIC_NAME_LENGTH: Final = 256

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters (Unicode category Cc), DEL included."""


def metric_name_problem(name: object) -> str | None:
    """Why `name` cannot be a metric name, or None if it can: the one rule of the ingest API, the
    importers, `lldmon watch` and the trainer hooks, so that a name one path accepts is never refused by
    another. A name is 1 to `MAX_METRIC_NAME_LENGTH` characters of text the database can store (no lone
    surrogate escapes: UTF-8 cannot encode them) and no terminal, log line or table cell can be forged
    with (no control characters: NUL, newline, escape, ...). The reason does not quote the name: callers
    say where it was."""
    if not isinstance(name, str):
        return f"metric names must be strings, not {type(name).__name__}"
    if not name:
        return "empty metric name"
    if len(name) > MAX_METRIC_NAME_LENGTH:
        return f"metric name longer than {MAX_METRIC_NAME_LENGTH} characters"
    control = _CONTROL.search(name)
    if control is not None:
        return f"metric name contains the control character {control.group()!r}"
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"metric name is not valid Unicode (lone surrogate {name[exc.start]!r})"
    return None


DEFAULT_SUCCESS_THRESHOLD: Final = 1.0
"""A response is "correct" when its reward is >= this (exact-match reward: 1.0 right, 0.0 wrong).
Trainers whose rewards are graded (format bonuses, partial credit) set their own threshold."""
DEFAULT_ANCHOR_SIZE: Final = 32
"""K: correct responses frozen into the anchor set."""
DEFAULT_ANCHOR_INTERVAL: Final = 5
"""N: the anchor set is re-scored every N optimizer steps."""
