"""Likelihood-preserving regularisers for GRPO on tool-using agents: LLDS ([LLD]) and SAPO's term.

Pure torch and fully vectorised over (batch, tokens): no Python loop over tokens, actions or
responses. Both losses are meant to be *added* to the policy loss by the caller, scaled by its own
coefficient (LLDS: lambda = 0.2, 0.3 for Qwen2.5-7B-Instruct; docs/science.md section 4).

Sign convention (docs/science.md section 4, opposite to the monitoring D): the token change is
d = log pi_old - log pi_theta, so **d > 0 means the token's likelihood fell**. `old_logp` is treated
as a constant (detached); the gradient flows only through `logp`, and every gate or selection is
computed without gradient.

Shared conventions:

- Shapes: `logp`, `old_logp`, `mask` (and `answer_mask`) are (B, T); `advantages` is (B,) or (B, T).
- `mask` non-zero = loss token (model-generated); an action is a maximal run of such tokens inside a
  row (`trainer_hooks.actions`). Values of `logp`/`old_logp` on mask == 0 tokens (tool feedback,
  padding) are never read, so garbage, NaN or -inf there is harmless for the loss and its gradient.
- Preserving set: responses with A >= 0. For (B, T) advantages the per-response A is the mean over
  the row's mask tokens (GRPO gives every token of a response the same value, so this is that
  value; the authors' code tests the per-token sign, identical in that case). A NaN advantage is
  not >= 0, so such a response is not preserved.
- Losses are computed in `logp`'s floating dtype promoted to at least float32 (bf16 sums over long
  responses would lose the gate's sign).
- Stats are 0-d detached tensors (no host sync, so they can be logged lazily): float ones in the
  loss dtype, counts as int64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from trainer_hooks.actions import action_ids, action_sums, num_actions

__all__ = [
    "Gate",
    "LLDSStats",
    "MASchedule",
    "Normalize",
    "SAPOStats",
    "llds_loss",
    "ma_beta",
    "sapo_kl_loss",
]

Gate = Literal["action", "response", "token"]
Normalize = Literal["loss_tokens", "preserving_tokens"]
MASchedule = Literal["paper", "code"]

_GATES: tuple[str, ...] = get_args(Gate)
_NORMALIZES: tuple[str, ...] = get_args(Normalize)
_MA_SCHEDULES: tuple[str, ...] = get_args(MASchedule)


@dataclass(frozen=True)
class LLDSStats:
    """Diagnostics of one `llds_loss` call (0-d detached tensors).

    Attributes:
        gated_action_frac: share of the actions of preserving responses whose gate is on (action
            gate: its own sum of d > 0; response gate: its response's sum of d > 0; token gate:
            always on, so 1). 0 when there is no such action.
        penalty_sum: sum_k gate * w_k * max(0, d_k) over the preserving set, before normalisation.
        n_preserving_tokens: number of mask tokens of preserving (A >= 0) responses (int64).
        n_preserving_actions: number of actions of preserving responses (int64): the denominator of
            `gated_action_frac`, to aggregate it over micro-batches.
    """

    gated_action_frac: Tensor
    penalty_sum: Tensor
    n_preserving_tokens: Tensor
    n_preserving_actions: Tensor


@dataclass(frozen=True)
class SAPOStats:
    """Diagnostics of one `sapo_kl_loss` call (0-d detached tensors).

    Attributes:
        selected_token_frac: share of preserving tokens with ratio <= threshold (0 if none).
        penalty_sum: sum of (log pi_old - log pi_theta) over the selected tokens, before normalisation.
        n_preserving_tokens: number of mask tokens of preserving (A >= 0) responses (int64).
    """

    selected_token_frac: Tensor
    penalty_sum: Tensor
    n_preserving_tokens: Tensor


# ----------------------------------------------------------------------------------------------
# validation and shared pieces


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_inputs(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    normalize: str,
    answer_mask: Tensor | None = None,
) -> None:
    if normalize not in _NORMALIZES:
        raise ValueError(f"normalize must be one of {_NORMALIZES}, got {normalize!r}")
    if logp.dim() != 2:
        raise ValueError(f"logp must be (B, T), got shape {_shape(logp)}")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be floating point, got {logp.dtype}")
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp has shape {_shape(old_logp)}, expected logp's {_shape(logp)}")
    if mask.shape != logp.shape:
        raise ValueError(f"mask has shape {_shape(mask)}, expected logp's {_shape(logp)}")
    if answer_mask is not None and answer_mask.shape != logp.shape:
        raise ValueError(f"answer_mask has shape {_shape(answer_mask)}, expected logp's {_shape(logp)}")
    batch = logp.shape[0]
    if not (
        (advantages.dim() == 1 and advantages.shape[0] == batch)
        or (advantages.dim() == 2 and advantages.shape == logp.shape)
    ):
        raise ValueError(
            f"advantages must be (B,) = ({batch},) or (B, T) = {_shape(logp)}, got {_shape(advantages)}"
        )


def _preserving(advantages: Tensor, valid: Tensor) -> Tensor:
    """(B,) bool: responses with A >= 0; (B, T) advantages reduced by their mean over mask tokens."""
    adv = advantages.detach()
    if adv.dim() == 1:
        return adv >= 0
    dtype = torch.promote_types(adv.dtype, torch.float32)
    adv = adv.to(dtype)
    total = torch.where(valid, adv, torch.zeros((), dtype=dtype, device=adv.device)).sum(dim=1)
    mean = total / valid.sum(dim=1).clamp(min=1).to(dtype)
    return mean >= 0


def _token_change(logp: Tensor, old_logp: Tensor, valid: Tensor) -> Tensor:
    """d = old_logp - logp on mask tokens, 0 elsewhere; graph-connected to `logp` only.

    `torch.where` (not a multiply) keeps NaN/-inf of masked-out tokens out of values and gradients.
    """
    dtype = torch.promote_types(logp.dtype, torch.float32)
    d = old_logp.detach().to(dtype) - logp.to(dtype)
    return torch.where(valid, d, torch.zeros((), dtype=dtype, device=d.device))


def _normalise(total: Tensor, valid: Tensor, preserving_tok: Tensor, normalize: str) -> Tensor:
    """`total` / token count; count 0 -> divide by 1 (total is then 0 and still attached to logp)."""
    count = valid.sum() if normalize == "loss_tokens" else preserving_tok.sum()
    return total / count.clamp(min=1).to(total.dtype)


# ----------------------------------------------------------------------------------------------
# LLDS


def llds_loss(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    *,
    gate: Gate = "action",
    answer_mask: Tensor | None = None,
    answer_weight: float = 1.0,
    normalize: Normalize = "loss_tokens",
) -> tuple[Tensor, LLDSStats]:
    """LLDS: penalise likelihood *drops* on responses GRPO wants to keep ([LLD] Sec. 5.5, App. B.3).

    GRPO's negative gradients from wrong responses push down tokens shared with correct ones
    (Lazy Likelihood Displacement); this term pushes those tokens of A >= 0 responses back up, but
    only where the drop is net (the gate), so it does not freeze the policy.

    For every action a (maximal run of mask tokens) of a response with A >= 0, with
    d_k = log pi_old - log pi_theta and w_k = `answer_weight` on `answer_mask` tokens, 1 elsewhere:

    - gate="action" (Eq. 4, default): 1[sum_{k in a} d_k > 0] * sum_{k in a} w_k max(0, d_k)
    - gate="response" (Eq. 10): the same with the gate on sum_k d_k over the whole response
    - gate="token" (Eq. 9): no gate, sum_k w_k max(0, d_k) (over-constrains; worst in the ablation)
    - answer weighting is the MA variant (Eq. 5); see `ma_beta` for the paper's and the code's
      schedules of the weight.

    The gate sums use the **unweighted** d, as the authors' code does (`dp_actor.py`: the chunk and
    sentence gates sum `old_log_prob - log_prob`, the answer coefficients are applied afterwards),
    so down-weighting answer tokens changes the penalty, never which actions are gated. The authors'
    `answer_mask` is inverted (1 = *not* answer); here 1 = answer token. Gates are strict (> 0), so
    d == 0 everywhere (the first mini-batch of a rollout) gives loss 0; a token with d == 0 gets no
    gradient (subgradient 0 of max(0, d)).

    Normalisation: "loss_tokens" (authors' code, with which lambda = 0.2 was tuned) divides the total
    by the number of all mask tokens of the micro-batch; "preserving_tokens" (paper Eq. 4) by the
    mask tokens of A >= 0 responses. A zero count gives a loss of 0 that is still attached to `logp`.

    Args:
        logp: (B, T) log pi_theta of the taken tokens (requires grad).
        old_logp: (B, T) log pi_old (rollout policy); treated as a constant.
        mask: (B, T) loss mask, non-zero = model token (tool feedback and padding 0).
        advantages: (B,) per response, or (B, T) per token (reduced by the mean over mask tokens).
        gate: "action" | "response" | "token".
        answer_mask: (B, T), non-zero = final-answer span token; None = no answer weighting.
        answer_weight: w on answer tokens (beta of Eq. 5), finite and >= 0.
        normalize: "loss_tokens" | "preserving_tokens".

    Returns:
        (loss, stats): 0-d loss in `logp`'s dtype promoted to at least float32, and `LLDSStats`.

    Raises:
        ValueError: unknown `gate`/`normalize`, mismatched shapes, or a negative/non-finite
            `answer_weight`.
    """
    if gate not in _GATES:
        raise ValueError(f"gate must be one of {_GATES}, got {gate!r}")
    _check_inputs(logp, old_logp, mask, advantages, normalize, answer_mask)
    if not math.isfinite(answer_weight) or answer_weight < 0:
        raise ValueError(f"answer_weight must be finite and >= 0, got {answer_weight!r}")

    valid = mask != 0
    d = _token_change(logp, old_logp, valid)
    d_const = d.detach()
    preserving = _preserving(advantages, valid)  # (B,)
    preserving_tok = valid & preserving[:, None]

    ids = action_ids(mask)  # (B, T), -1 off-action
    n_act = num_actions(ids)  # (B,)
    n_pres_actions = torch.where(preserving, n_act, torch.zeros_like(n_act)).sum()
    if gate == "action":
        n_max = int(n_act.max().item()) if n_act.numel() else 0
        action_on = action_sums(d_const, ids, n_max) > 0  # (B, n_max); absent slots sum to 0 -> off
        n_gated = (action_on & preserving[:, None]).sum()
        # Spread the per-action gate back to tokens; off-action tokens read an extra False slot.
        padded = torch.cat([action_on, action_on.new_zeros(action_on.shape[0], 1)], dim=1)
        slot = torch.where(ids >= 0, ids, torch.full_like(ids, n_max))
        gate_tok = padded.gather(1, slot)
    elif gate == "response":
        response_on = d_const.sum(dim=1) > 0  # (B,)
        n_gated = torch.where(response_on & preserving, n_act, torch.zeros_like(n_act)).sum()
        gate_tok = response_on[:, None].expand_as(valid)
    else:
        n_gated = n_pres_actions
        gate_tok = torch.ones_like(valid)

    active = preserving_tok & gate_tok & (d_const > 0)
    penalty = torch.where(active, d, torch.zeros_like(d))
    if answer_mask is not None and answer_weight != 1.0:
        weight = torch.where(
            answer_mask != 0,
            torch.full_like(d_const, answer_weight),
            torch.ones_like(d_const),
        )
        penalty = penalty * weight
    total = penalty.sum()
    loss = _normalise(total, valid, preserving_tok, normalize)

    stats = LLDSStats(
        gated_action_frac=(n_gated.to(d_const.dtype) / n_pres_actions.clamp(min=1).to(d_const.dtype)),
        penalty_sum=total.detach(),
        n_preserving_tokens=preserving_tok.sum(),
        n_preserving_actions=n_pres_actions,
    )
    return loss, stats


def ma_beta(
    valid_searches_mean: float,
    schedule: MASchedule = "paper",
    *,
    code_scale: float = 1.0,
) -> float:
    """Answer-token weight beta of LLDS-MA ([LLD] Eq. 5) from V_s, the mean number of valid searches
    per trajectory at the step.

    - schedule="paper" (default): beta = min(V_s / 2, 1). When the policy collapses to a single
      search call (V_s ~ 1) the answer span is protected half as much; from two searches on it is
      plain LLDS (beta = 1).
    - schedule="code": the authors' code (`verl/workers/actor/dp_actor.py`, `mask_adaptive`): the
      answer tokens get the coefficient min(lambda_answer * max(V_s - 1, 0), lambda) while the other
      tokens get lambda, i.e. relative to lambda beta = min(code_scale * max(V_s - 1, 0), 1) with
      `code_scale` = lambda_answer / lambda (their `answer_no_reduce_lambda / no_reduce_lambda`;
      default 1). Unlike the paper's ramp it is 0 at V_s <= 1: a policy that searches once gets
      no answer-span protection at all; full protection from V_s = 1 + 1 / code_scale on.

    Input handling (both schedules): negative or -inf V_s -> as V_s = 0; +inf -> 1.0; NaN (no
    trajectories or a broken metric, i.e. no evidence of a collapsed search count) -> 1.0, i.e.
    plain LLDS rather than silently dropping the answer constraint.

    Raises:
        ValueError: unknown `schedule`, or `code_scale` negative or not finite.
    """
    if schedule not in _MA_SCHEDULES:
        raise ValueError(f"schedule must be one of {_MA_SCHEDULES}, got {schedule!r}")
    if not math.isfinite(code_scale) or code_scale < 0:
        raise ValueError(f"code_scale must be finite and >= 0, got {code_scale!r}")
    v = float(valid_searches_mean)
    if math.isnan(v):
        return 1.0
    v = max(v, 0.0)
    if schedule == "paper":
        return min(v / 2.0, 1.0)
    if math.isinf(v):
        return 1.0 if code_scale > 0 else 0.0
    return min(code_scale * max(v - 1.0, 0.0), 1.0)


# ----------------------------------------------------------------------------------------------
# SAPO (reported form)


def sapo_kl_loss(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    *,
    threshold: float,
    normalize: Normalize = "preserving_tokens",
) -> tuple[Tensor, SAPOStats]:
    """SAPO's one-line term: pull up positive tokens whose ratio drifted down ([SAPO], docs/science.md
    section 5).

    On mask tokens of A >= 0 responses whose ratio r = pi_theta / pi_old <= `threshold`, add
    -log r = log pi_old - log pi_theta; the sum is divided by "preserving_tokens" (default: the mask
    tokens of A >= 0 responses, the population the term is defined on, as in the reported form) or
    "loss_tokens" (all mask tokens of the micro-batch). This setting is SAPO's own, independent of
    the one of `llds_loss` (whose default "loss_tokens" follows the LLDS authors' code): a caller
    running both passes each its own. It counters SAPO's failure signature, Importance Sampling
    Distribution Drift (ratios of positive tokens drifting toward 0).

    Caveats: this is the form reported by readers of the SAPO paper (arXiv 2603.10069, "Improving
    Search Agent with One Line of Code"), not confirmed from a published formula or code; the
    threshold and the weight (applied by the caller) are unpublished and must be tuned. It is NOT
    TRL's loss_type="sapo" (Soft Adaptive Policy Optimization), an unrelated method.

    The selection r <= threshold is computed without gradient, in log space
    (log pi_theta - log pi_old <= log threshold) so large ratios cannot overflow. Each selected token
    gets d loss / d logp = -1 / count: minimising pushes its log-prob up.

    Args:
        logp: (B, T) log pi_theta (requires grad). old_logp: (B, T), constant.
        mask: (B, T) loss mask. advantages: (B,) or (B, T) (mean over mask tokens).
        threshold: ratio threshold t > 0 (e.g. slightly below 1).
        normalize: "preserving_tokens" (default) | "loss_tokens".

    Returns:
        (loss, stats): 0-d loss (dtype as in `llds_loss`) and `SAPOStats`.

    Raises:
        ValueError: unknown `normalize`, mismatched shapes, or threshold NaN or <= 0.
    """
    _check_inputs(logp, old_logp, mask, advantages, normalize)
    if math.isnan(threshold) or threshold <= 0:
        raise ValueError(f"threshold must be > 0, got {threshold!r}")

    valid = mask != 0
    neg_log_r = _token_change(logp, old_logp, valid)  # -log r = old - new
    preserving_tok = valid & _preserving(advantages, valid)[:, None]
    selected = preserving_tok & (-neg_log_r.detach() <= math.log(threshold))
    total = torch.where(selected, neg_log_r, torch.zeros_like(neg_log_r)).sum()
    loss = _normalise(total, valid, preserving_tok, normalize)

    n_pres = preserving_tok.sum()
    dtype = neg_log_r.dtype
    stats = SAPOStats(
        selected_token_frac=selected.sum().to(dtype) / n_pres.clamp(min=1).to(dtype),
        penalty_sum=total.detach(),
        n_preserving_tokens=n_pres,
    )
    return loss, stats
