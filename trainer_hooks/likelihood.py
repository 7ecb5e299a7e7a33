"""Likelihood-displacement measurement of one GRPO step, from tensors the trainer already has.

Pure torch and fully vectorised over (batch, tokens): no Python loop over tokens, actions or
responses, and a constant number of host syncs per call (independent of B and T).

Sign convention (docs/science.md section 2, [LLD] Def. 4.1): D = log pi_new - log pi_old per token,
summed per action (D_action) and per trajectory (D_traj); **D < 0 means the likelihood fell**.
An action is a maximal run of mask == 1 tokens inside one row (`trainer_hooks.actions`).
All per-token work runs on the compact list of the N mask tokens, per-action work on the K actions.

Populations (decisions where the contract is silent):

- "pos" / "neg" responses are those with A > 0 / A < 0 **and at least one mask token**; responses
  with no mask token have no likelihood and get no gradient, so they are left out of every
  likelihood, ratio and advantage-mass metric. A NaN advantage is neither pos nor neg.
- "correct" responses (only with `rewards` and `success_threshold`) are those with reward >=
  `success_threshold` and at least one mask token; a NaN reward is not correct. Unlike "pos", this
  population does not shrink when groups become all-correct (A = 0), so `lld/logp_correct` is the
  curve of [LLD] Fig. 2 (docs/science.md section 2).
- The advantage mass ratio is per *token* ([CalibAdv]): every loss-mask token carries its advantage
  ((B,) advantages are broadcast over the row, (B, T) ones are read per token), so responses weigh
  by their length. Per response it would be identically 1 in GRPO.
- Reward, response length, turns, valid searches, garbled share and zero-std groups are over all B
  responses (an empty response has length 0 and 0 actions, and is never garbled).
- A metric whose population is empty is omitted from `StepMeasurement.metrics` (NaN is reserved for
  NaN/inf in the data, which propagates: a NaN on any token of the population makes the mean, the
  min and the shares of that population NaN). Values on tokens with mask == 0 (tool feedback,
  padding) are never read, so garbage or -inf there is harmless.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from contracts import metrics as M
from contracts.wire import ACTION_COLUMNS, ACTION_SOURCES

__all__ = [
    "Source",
    "StepMeasurement",
    "correct_rows",
    "empty_action_columns",
    "measure_step",
    "response_advantages",
]

Source = Literal["loss", "probe"]


def empty_action_columns() -> dict[str, list[Any]]:
    """Columnar action records with no rows: one empty list per `contracts.wire.ACTION_COLUMNS` key."""
    return {name: [] for name in ACTION_COLUMNS}


@dataclass(frozen=True)
class StepMeasurement:
    """Result of `measure_step`.

    Attributes:
        metrics: canonical metric name (`contracts.metrics`) -> value; metrics with an empty
            population are absent.
        actions: columnar per-action records, keys exactly `contracts.wire.ACTION_COLUMNS`, one
            list entry per action (possibly subsampled), in (traj_index, action_index) order.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    actions: dict[str, list[Any]] = field(default_factory=empty_action_columns)


def response_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """Per-response advantage.

    Args:
        advantages: (B,) per-response, or (B, T) per-token advantages.
        mask: (B, T) loss mask; non-zero = model token.

    Returns:
        (B,) advantages, in `advantages`' floating dtype (at least float32). A (B,) input is
        returned as is (cast). For a (B, T) input the value is the mean over the row's mask tokens
        (GRPO gives every token of a response the same value, so this is that value; with per-token
        calibrated advantages it is their mean). Rows without mask tokens get 0.0; tokens with
        mask == 0 are never read.
    """
    dtype = torch.promote_types(advantages.dtype, torch.float32)
    if advantages.dim() == 1:
        if advantages.shape[0] != mask.shape[0]:
            raise ValueError(f"advantages has shape {tuple(advantages.shape)}, mask {tuple(mask.shape)}")
        return advantages.to(dtype)
    if advantages.shape != mask.shape:
        raise ValueError(
            f"advantages must be (B,) or (B, T) like mask {tuple(mask.shape)}, got {tuple(advantages.shape)}"
        )
    m = mask != 0
    adv = advantages.to(dtype)
    total = torch.where(m, adv, torch.zeros((), dtype=dtype, device=adv.device)).sum(dim=1)
    count = m.sum(dim=1)
    return torch.where(count > 0, total / count.clamp(min=1).to(dtype), torch.zeros_like(total))


def correct_rows(rewards: Tensor, threshold: float) -> Tensor:
    """(B,) bool: reward >= `threshold` ("correct" in [LLD]); a NaN reward is not correct.

    Says nothing about mask tokens: `measure_step` also requires at least one of them.
    """
    return rewards >= threshold  # NaN >= x is False


# ----------------------------------------------------------------------------------------------
# small tensor helpers (all return 0-d tensors; nothing syncs with the host)


def _masked_mean(values: Tensor, pop: Tensor) -> tuple[Tensor, Tensor]:
    """Mean of `values` where `pop`, and the population size (both float64 0-d)."""
    n = pop.sum().to(torch.float64)
    total = torch.where(pop, values, torch.zeros_like(values)).sum().to(torch.float64)
    return total / n.clamp(min=1.0), n


def _nan_aware_share(hit: Tensor, values: Tensor, pop: Tensor) -> tuple[Tensor, Tensor]:
    """Share of `pop` where `hit`; NaN if `values` is NaN anywhere in `pop`."""
    n = pop.sum().to(torch.float64)
    share = (hit & pop).sum().to(torch.float64) / n.clamp(min=1.0)
    has_nan = (torch.isnan(values) & pop).any()
    return torch.where(has_nan, torch.full_like(share, math.nan), share), n


def _group_index(
    batch: int, group_ids: Tensor | None, group_size: int | None, device: torch.device
) -> tuple[Tensor, int] | None:
    """(B,) dense group index 0..G-1 (ordered by original label) and G, or None without groups."""
    if group_ids is not None:
        labels, inverse = torch.unique(group_ids, return_inverse=True)
        return inverse.to(device), int(labels.shape[0])
    if group_size is not None:
        # A trailing partial block (batch not a multiple of group_size) is its own group.
        return torch.arange(batch, device=device) // group_size, -(-batch // group_size)
    return None


def _zero_std_group_share(rewards: Tensor, groups: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """Share of groups whose rewards are all exactly equal; NaN if a group holds a NaN reward."""
    r = rewards.to(torch.float64)
    gmax = torch.full((n_groups,), -math.inf, dtype=torch.float64, device=r.device)
    gmin = torch.full((n_groups,), math.inf, dtype=torch.float64, device=r.device)
    gmax = gmax.scatter_reduce(0, groups, r, reduce="amax", include_self=False)
    gmin = gmin.scatter_reduce(0, groups, r, reduce="amin", include_self=False)
    gnan = torch.zeros(n_groups, dtype=torch.float64, device=r.device)
    gnan = gnan.scatter_add(0, groups, torch.isnan(r).to(torch.float64))
    zero = torch.where(gnan > 0, torch.full_like(gmax, math.nan), (gmax == gmin).to(torch.float64))
    pop = torch.ones(n_groups, dtype=torch.bool, device=r.device)
    return _masked_mean(zero, pop)


def _mass_ratio(adv: Tensor, pop: Tensor) -> tuple[Tensor, Tensor]:
    """sum_{A>0} A / |sum_{A<0} A| over the elements of `pop` ([CalibAdv]); NaN advantages land in both sums.

    No negative mass: +inf if there is positive mass, NaN if both masses are 0 (no learning signal).
    """
    zero = torch.zeros_like(adv)
    pos_mass = torch.where(pop & ~(adv <= 0), adv, zero).sum()
    neg_mass = torch.where(pop & ~(adv >= 0), -adv, zero).sum()  # never -0.0: x / -0.0 = -inf
    return pos_mass / neg_mass, pop.sum().to(torch.float64)


def _to(value: Tensor | None, device: torch.device) -> Tensor | None:
    return None if value is None else value.to(device)


def _check_shape(name: str, value: Tensor | None, shape: tuple[int, ...]) -> None:
    if value is not None and tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}")


# ----------------------------------------------------------------------------------------------


def measure_step(
    *,
    old_logp: Tensor,
    new_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    rewards: Tensor | None = None,
    entropy: Tensor | None = None,
    answer_mask: Tensor | None = None,
    valid_searches: Tensor | None = None,
    group_ids: Tensor | None = None,
    group_size: int | None = None,
    success_threshold: float | None = None,
    eps: float = 0.0,
    clip_eps: float = 0.2,
    garbled_ppl: float = 50.0,
    max_action_records: int | None = None,
    seed: int = 0,
    source: Source = "loss",
    step: int = 0,
) -> StepMeasurement:
    """Measure likelihood displacement and rollout health for one batch of responses.

    Args:
        old_logp: (B, T) per-token log-probs under the rollout policy.
        new_logp: (B, T) per-token log-probs under the current/updated policy (may be `old_logp`).
        mask: (B, T) loss mask; non-zero = model token, 0 = tool feedback or padding.
        advantages: (B,) or (B, T); see `response_advantages`.
        rewards: (B,) optional scalar rewards.
        entropy: (B, T) optional per-token entropies.
        answer_mask: (B, T) optional; non-zero on the final answer span.
        valid_searches: (B,) optional number of valid search calls per response.
        group_ids: (B,) optional GRPO group label (any integers); wins over `group_size`.
        group_size: optional; without `group_ids`, groups are consecutive blocks of this size
            (a trailing partial block is its own group).
        success_threshold: with `rewards`, responses with reward >= this (and a mask token) form
            the "correct" population: LOGP_CORRECT, DELTA_TRAJ_CORRECT and
            FRAC_TRAJ_DECREASED_CORRECT, defined like their "pos" counterparts. None: not measured.
        eps: decrease threshold: an action/trajectory "decreased" when D < eps.
        clip_eps: an importance ratio is "low" when r < 1 - clip_eps.
        garbled_ppl: an action is garbled when exp(-mean old_logp over it) >= garbled_ppl
            ([CalibAdv]); the rollout policy's perplexity of its own output.
        max_action_records: cap on action records; a larger set is subsampled uniformly without
            replacement (`torch.randperm` with a CPU generator seeded by `seed`), order kept.
        seed: seed of that subsample.
        source: "loss" (in-loss deltas) or "probe" (post-update re-scoring), copied to the records.
        step: training step, copied to the records.

    Returns:
        `StepMeasurement`. Metric values are Python floats (NaN/inf propagate from the data);
        REWARD_STD is the population std (unbiased=False); ADV_POS_NEG_MASS_RATIO is per loss-mask
        token (ADV_POS_NEG_MASS_RATIO_ANSWER: over mask tokens with answer_mask != 0), +inf with
        positive but no negative mass and NaN when both are 0 or an advantage is NaN. Records: `reward` is NaN when
        `rewards` is None; `is_answer` is True when an action shares a token with `answer_mask`.

    Tensors may live on any device; the others are moved to `old_logp`'s (a no-op when they are
    there already), work is done there in float32 (float64 if `old_logp` is float64), and only the
    final scalars and record columns are copied to the host, in a fixed number of syncs.

    Raises:
        ValueError: on inconsistent shapes, an unknown `source`, `group_size` <= 0 or a negative
            `max_action_records`.
    """
    if source not in ACTION_SOURCES:
        raise ValueError(f"source must be one of {ACTION_SOURCES}, got {source!r}")
    if mask.dim() != 2:
        raise ValueError(f"mask must be (B, T), got shape {tuple(mask.shape)}")
    batch, tokens = mask.shape
    for name, tok in (("old_logp", old_logp), ("new_logp", new_logp)):
        _check_shape(name, tok, (batch, tokens))
    _check_shape("entropy", entropy, (batch, tokens))
    _check_shape("answer_mask", answer_mask, (batch, tokens))
    _check_shape("rewards", rewards, (batch,))
    _check_shape("valid_searches", valid_searches, (batch,))
    _check_shape("group_ids", group_ids, (batch,))
    if advantages.shape not in ((batch,), (batch, tokens)):
        raise ValueError(
            f"advantages must have shape {(batch,)} or {(batch, tokens)}, got {tuple(advantages.shape)}"
        )
    if group_size is not None and group_size <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    if max_action_records is not None and max_action_records < 0:
        raise ValueError(f"max_action_records must be >= 0 or None, got {max_action_records}")
    if batch == 0:
        return StepMeasurement()
    dev = old_logp.device  # everything moves there (no copy when it is there already)
    with torch.inference_mode():
        return _measure(
            old_logp=old_logp,
            new_logp=new_logp if new_logp is old_logp else new_logp.to(dev),
            mask=mask.to(dev),
            advantages=advantages.to(dev),
            rewards=_to(rewards, dev),
            entropy=_to(entropy, dev),
            answer_mask=_to(answer_mask, dev),
            valid_searches=_to(valid_searches, dev),
            groups=_group_index(batch, _to(group_ids, dev), group_size, dev) if rewards is not None else None,
            success_threshold=success_threshold,
            eps=eps,
            clip_eps=clip_eps,
            garbled_ppl=garbled_ppl,
            max_action_records=max_action_records,
            seed=seed,
            source=source,
            step=step,
        )


class _Segments(NamedTuple):
    """Compact layout: the N mask tokens and the K actions of a batch, both in row-major order."""

    flat: Tensor  # (N,) flat index b * T + t of each mask token
    act_row: Tensor  # (K,) response of each action
    act_index: Tensor  # (K,) action index within its response
    act_len: Tensor  # (K,) int64 token count of each action (>= 1)
    n_act: Tensor  # (B,) number of actions per response


def _segments(m: Tensor) -> _Segments:
    """Segment a (B, T) bool mask into actions.

    Same definition as `trainer_hooks.actions` (an action is a maximal run of mask tokens inside
    one row; the tests check equality with `action_ids`/`num_actions`/`action_sums`), but found
    from the run starts instead of a (B, T) int64 cumsum: on a Search-R1 batch the int64
    intermediates of `action_ids` cost more than the whole rest of the measurement.
    """
    tokens = m.shape[1]
    starts = m.clone()
    starts[:, 1:] &= ~m[:, :-1]
    flat = m.reshape(-1).nonzero().squeeze(1)  # host sync: N
    # Position, among the N mask tokens, of each action's first token (the actions are contiguous).
    first_tok = starts.reshape(-1)[flat].nonzero().squeeze(1)  # host sync: K
    act_len = torch.diff(first_tok, append=first_tok.new_full((1,), flat.shape[0]))
    act_row = torch.div(flat[first_tok], tokens, rounding_mode="floor")
    n_act = starts.sum(dim=1)
    first_act = torch.cumsum(n_act, dim=0) - n_act  # global index of each response's first action
    act_index = torch.arange(first_tok.shape[0], device=m.device) - first_act[act_row]
    return _Segments(flat, act_row, act_index, act_len, n_act)


def _gather(values: Tensor, seg: _Segments, dtype: torch.dtype) -> Tensor:
    """(N,) values of a (B, T) tensor at the mask tokens."""
    return values.reshape(-1)[seg.flat].to(dtype)


def _per_action(values: Tensor, seg: _Segments, reduce: str = "sum") -> Tensor:
    """(K,) float64 `reduce` of (N,) token values over each action (NaN propagates)."""
    # The N tokens are grouped by action already, so a segment reduction does it (no scatter).
    out = torch.segment_reduce(values, reduce, lengths=seg.act_len, unsafe=True)
    return out.to(torch.float64)


def _per_response(values: Tensor, seg: _Segments) -> Tensor:
    """(B,) float64 sums of (K,) action values over each response (0 for no action)."""
    return torch.segment_reduce(values.to(torch.float64), "sum", lengths=seg.n_act, unsafe=True)


def _measure(
    *,
    old_logp: Tensor,
    new_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    rewards: Tensor | None,
    entropy: Tensor | None,
    answer_mask: Tensor | None,
    valid_searches: Tensor | None,
    groups: tuple[Tensor, int] | None,
    success_threshold: float | None,
    eps: float,
    clip_eps: float,
    garbled_ppl: float,
    max_action_records: int | None,
    seed: int,
    source: Source,
    step: int,
) -> StepMeasurement:
    dtype = torch.promote_types(old_logp.dtype, torch.float32)
    seg = _segments(mask if mask.dtype == torch.bool else mask != 0)
    adv = response_advantages(advantages, mask).to(torch.float64)

    # --- per token (N,), per action (K,), per response (B,) ---
    old = _gather(old_logp, seg, dtype)
    # Same tensor (first mini-batch of a rollout batch): skip a gather, keep NaN/inf semantics.
    delta = (old if new_logp is old_logp else _gather(new_logp, seg, dtype)) - old
    a_len = seg.act_len.to(torch.float64)
    a_delta = _per_action(delta, seg)
    a_old = _per_action(old, seg)
    r_delta = _per_response(a_delta, seg)
    r_old = _per_response(a_old, seg)
    r_len = _per_response(a_len, seg)
    nonempty = seg.n_act > 0
    pos = nonempty & (adv > 0)
    neg = nonempty & (adv < 0)
    pos_actions = pos[seg.act_row]
    everyone = torch.ones_like(nonempty)
    correct = None
    if rewards is not None and success_threshold is not None:
        correct = nonempty & correct_rows(rewards, success_threshold)

    def logp_level(rows: Tensor) -> tuple[Tensor, Tensor]:  # token-weighted mean old log-prob
        n = torch.where(rows, r_len, torch.zeros_like(r_len)).sum()
        return torch.where(rows, r_old, torch.zeros_like(r_old)).sum() / n.clamp(min=1.0), n

    vals: dict[str, tuple[Tensor, Tensor]] = {}
    vals[M.LOGP_POS] = logp_level(pos)
    vals[M.LOGP_NEG] = logp_level(neg)
    vals[M.DELTA_TRAJ_POS] = _masked_mean(r_delta, pos)
    vals[M.DELTA_TRAJ_NEG] = _masked_mean(r_delta, neg)
    vals[M.DELTA_ACTION_POS] = _masked_mean(a_delta, pos_actions)
    vals[M.FRAC_TRAJ_DECREASED_POS] = _nan_aware_share(r_delta < eps, r_delta, pos)
    vals[M.FRAC_ACTION_DECREASED_POS] = _nan_aware_share(a_delta < eps, a_delta, pos_actions)
    if correct is not None:
        vals[M.LOGP_CORRECT] = logp_level(correct)
        vals[M.DELTA_TRAJ_CORRECT] = _masked_mean(r_delta, correct)
        vals[M.FRAC_TRAJ_DECREASED_CORRECT] = _nan_aware_share(r_delta < eps, r_delta, correct)
    vals[M.RESPONSE_LENGTH_MEAN] = _masked_mean(r_len, everyone)
    vals[M.TURNS_MEAN] = _masked_mean(seg.n_act.to(torch.float64), everyone)

    # --- [CalibAdv] advantage mass per loss-mask token ---
    if advantages.dim() == 1:  # broadcast over the row
        tok_row = torch.div(seg.flat, max(mask.shape[1], 1), rounding_mode="floor")
        tok_adv = adv[tok_row]
    else:
        tok_adv = _gather(advantages, seg, torch.float64)
    vals[M.ADV_POS_NEG_MASS_RATIO] = _mass_ratio(tok_adv, torch.ones_like(tok_adv, dtype=torch.bool))
    tok_answer = None
    if answer_mask is not None:
        tok_answer = answer_mask.reshape(-1)[seg.flat] != 0
        vals[M.ADV_POS_NEG_MASS_RATIO_ANSWER] = _mass_ratio(tok_adv, tok_answer)

    # --- importance ratios r = exp(D) on the tokens of A>0 responses, reduced per action first ---
    ratio = torch.exp(delta)
    a_ratio = _per_action(ratio, seg)  # r >= 0, so a sum is NaN iff a NaN ratio is in it
    a_ratio_min = _per_action(ratio, seg, "min")
    a_ratio_low = _per_action((ratio < 1.0 - clip_eps).to(dtype), seg)
    n_pos_tok = torch.where(pos_actions, a_len, torch.zeros_like(a_len)).sum()
    zero = torch.zeros_like(a_ratio)
    vals[M.RATIO_POS_MEAN] = (
        torch.where(pos_actions, a_ratio, zero).sum() / n_pos_tok.clamp(min=1.0),
        n_pos_tok,
    )
    # amin skips nothing: a NaN in the population makes the min NaN. Padded with one +inf because
    # amin refuses an empty tensor.
    pos_min = torch.where(pos_actions, a_ratio_min, torch.full_like(a_ratio_min, math.inf))
    vals[M.RATIO_POS_MIN] = (torch.cat([pos_min, pos_min.new_full((1,), math.inf)]).amin(), n_pos_tok)
    low = torch.where(pos_actions, a_ratio_low, zero).sum() / n_pos_tok.clamp(min=1.0)
    has_nan = (torch.isnan(a_ratio) & pos_actions).any()
    vals[M.RATIO_POS_FRAC_LOW] = (torch.where(has_nan, torch.full_like(low, math.nan), low), n_pos_tok)

    # --- garbled responses: some action with perplexity exp(-mean old_logp) >= garbled_ppl ---
    a_logp_mean = a_old / a_len
    a_ppl = torch.exp(-a_logp_mean)
    r_garbled = _per_response((a_ppl >= garbled_ppl).to(torch.float64), seg) > 0
    r_nan = _per_response(torch.isnan(a_ppl).to(torch.float64), seg) > 0
    garbled = torch.where(r_nan, torch.full_like(r_len, math.nan), r_garbled.to(torch.float64))
    vals[M.GARBLED_FRAC] = _masked_mean(garbled, everyone)

    # --- optional inputs ---
    if entropy is not None:
        ent = _gather(entropy, seg, dtype)
        vals[M.ENTROPY_MEAN] = (ent.sum().to(torch.float64) / max(ent.shape[0], 1), a_len.sum())
    if rewards is not None:
        rw = rewards.to(torch.float64)
        vals[M.REWARD_MEAN] = _masked_mean(rw, everyone)
        vals[M.REWARD_STD] = (rw.std(correction=0), vals[M.REWARD_MEAN][1])
        if groups is not None:
            vals[M.ADV_FRAC_ZERO_STD_GROUPS] = _zero_std_group_share(rewards, *groups)
    if valid_searches is not None:
        vals[M.SEARCH_VALID_PER_TRAJ] = _masked_mean(valid_searches.to(torch.float64), everyone)

    names = list(vals)
    packed = torch.stack([torch.stack([v.to(torch.float64), n]) for v, n in vals.values()])
    host = packed.cpu().tolist()  # host sync: every metric at once
    metric_out = {name: value for name, (value, n) in zip(names, host, strict=True) if n > 0}

    a_answer = None
    if tok_answer is not None:
        a_answer = _per_action(tok_answer.to(dtype), seg) > 0
    records = _action_records(
        seg=seg,
        a_delta=a_delta,
        a_logp_mean=a_logp_mean,
        a_answer=a_answer,
        adv=adv,
        rewards=rewards,
        max_records=max_action_records,
        seed=seed,
        source=source,
        step=step,
    )
    return StepMeasurement(metrics=metric_out, actions=records)


def _action_records(
    *,
    seg: _Segments,
    a_delta: Tensor,
    a_logp_mean: Tensor,
    a_answer: Tensor | None,
    adv: Tensor,
    rewards: Tensor | None,
    max_records: int | None,
    seed: int,
    source: Source,
    step: int,
) -> dict[str, list[Any]]:
    """Columnar records of the K actions (row-major), optionally subsampled."""
    keep = torch.arange(seg.act_row.shape[0], device=seg.act_row.device)
    if max_records is not None and keep.shape[0] > max_records:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        chosen = torch.randperm(keep.shape[0], generator=gen)[:max_records]
        keep = chosen.sort().values.to(keep.device)
    rows = seg.act_row[keep]
    reward = (
        rewards.to(torch.float64)[rows]
        if rewards is not None
        else torch.full(rows.shape, math.nan, dtype=torch.float64, device=rows.device)
    )
    answer = a_answer[keep] if a_answer is not None else torch.zeros_like(rows, dtype=torch.bool)
    ints = torch.stack([rows, seg.act_index[keep], seg.act_len[keep].to(torch.int64), answer.to(torch.int64)])
    floats = torch.stack([a_delta[keep], a_logp_mean[keep], adv[rows], reward])
    int_cols, float_cols = ints.cpu().tolist(), floats.cpu().tolist()
    count = len(int_cols[0])
    return {
        "step": [step] * count,
        "traj_index": int_cols[0],
        "action_index": int_cols[1],
        "n_tokens": int_cols[2],
        "delta": float_cols[0],
        "old_logp_mean": float_cols[1],
        "advantage": float_cols[2],
        "reward": float_cols[3],
        "is_answer": [bool(x) for x in int_cols[3]],
        "source": [source] * count,
    }
