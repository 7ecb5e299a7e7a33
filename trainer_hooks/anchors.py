"""The anchor set: K correct responses frozen when first seen and re-scored every N steps.

docs/science.md section 2 ("anchor set"): [LLD] Fig. 2 plots the mean per-token log-prob of correct
responses, but the correct responses of each step are new samples, so that curve mixes a change of
policy with a change of population. The anchor set removes the second: the first K correct responses
(reward >= success threshold) are frozen, and every N optimizer steps the trainer re-scores exactly
those token sequences under the current policy. Their log-prob level (`lld/anchor/logp`) and its
change since capture (`lld/anchor/delta`, `lld/anchor/frac_decreased`) then move only when the
policy does.

Pure torch, trainer-agnostic (no trl/transformers import). An adapter's loop:

    anchors = AnchorSet(capacity=M.DEFAULT_ANCHOR_SIZE, success_threshold=threshold)
    # after each rollout (cheap no-op once full):
    anchors.offer(prompt_ids=..., prompt_mask=..., completion_ids=..., completion_mask=...,
                  loss_mask=..., rewards=..., step=step)
    # every N optimizer steps, after the update:
    if len(anchors):
        b = anchors.batch(device)
        logp = per_token_logps(model, b.input_ids, b.attention_mask, b.logits_to_keep)  # (K, T)
        metrics = anchors.measure(logp, step=step)

Layout (TRL convention): prompts are LEFT-padded (prompt_mask 0 on the left), completions
RIGHT-padded; `batch()` re-pads anchors of different widths the same way, so that a causal LM
scores the completion tokens as the last `logits_to_keep` positions. Padding is masked out by the
attention mask; with rotary position embeddings (Qwen, Llama, ...) a different amount of left
padding shifts all positions by a constant and leaves the log-probs unchanged. (Models with
absolute learned positions need `position_ids` from the attention mask, as for any left-padded batch.)

Baseline: an anchor's reference log-probs are the first finite values seen for it: the rollout-time
log-probs given to `offer` (`old_logp`), else its first `measure`. Anchors whose baseline is set by a
`measure` call are excluded from that call's delta and share (their change is 0 by definition).

Tokens with loss_mask == 0 (tool feedback, padding) are never read. Everything is vectorised over
anchors and tokens; anchors are kept on the CPU (K x width integers, a few hundred KiB).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from contracts import metrics as M

__all__ = ["AnchorBatch", "AnchorSet"]

_STATE_VERSION = 1
_TENSOR_KEYS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "loss_mask",
    "baseline",
    "has_baseline",
    "captured_step",
    "baseline_step",
)


class AnchorBatch(NamedTuple):
    """One forward pass worth of anchors (rows in capture order).

    Attributes:
        input_ids: (K, P + T) int64, left-padded prompts followed by right-padded completions.
        attention_mask: (K, P + T) int64, 1 on real tokens.
        logits_to_keep: T, the completion width: the log-probs to return are those of the last T
            positions (TRL `_get_per_token_logps_and_entropies(model, input_ids, attention_mask,
            logits_to_keep)`).
        loss_mask: (K, T) int64, 1 on the model's tokens (tool feedback and padding are 0).
    """

    input_ids: Tensor
    attention_mask: Tensor
    logits_to_keep: int
    loss_mask: Tensor


def _left_pad(x: Tensor, width: int, value: float) -> Tensor:
    return x if x.shape[1] == width else F.pad(x, (width - x.shape[1], 0), value=value)


def _right_pad(x: Tensor, width: int, value: float) -> Tensor:
    return x if x.shape[1] == width else F.pad(x, (0, width - x.shape[1]), value=value)


def _check_2d(name: str, value: Tensor, shape: tuple[int, int] | None) -> None:
    if value.dim() != 2 or (shape is not None and tuple(value.shape) != shape):
        want = f"{shape}" if shape is not None else "(B, width)"
        raise ValueError(f"{name} must have shape {want}, got {tuple(value.shape)}")


def _first_unique(existing: Tensor, candidates: Tensor) -> Tensor:
    """(n,) bool: candidate rows equal to no row of `existing` and to no earlier candidate (exact)."""
    rows = torch.cat([existing, candidates])
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    index = torch.arange(rows.shape[0])
    first = torch.full((rows.shape[0],), rows.shape[0], dtype=torch.int64)
    first = first.scatter_reduce(0, inverse, index, reduce="amin")
    return (first[inverse] == index)[existing.shape[0] :]


class AnchorSet:
    """A frozen set of correct responses, re-scored under the current policy (`lld/anchor/*`).

    Args:
        capacity: K, the most anchors kept (0 disables the set).
        success_threshold: a response is correct when its reward is >= this (NaN: never).
        eps: an anchor "decreased" when its summed change D_traj < eps (as in `measure_step`).
        pad_token_id: token id of every padding position (attention mask 0) of `batch()`; masked
            out, so any id works.

    Raises:
        ValueError: if `capacity` < 0.
    """

    def __init__(
        self,
        capacity: int = M.DEFAULT_ANCHOR_SIZE,
        success_threshold: float = M.DEFAULT_SUCCESS_THRESHOLD,
        *,
        eps: float = 0.0,
        pad_token_id: int = 0,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.success_threshold = success_threshold
        self.eps = eps
        self.pad_token_id = pad_token_id
        self._clear()

    def _clear(self) -> None:
        long, f64 = torch.int64, torch.float64
        self._prompt_ids = torch.zeros(0, 0, dtype=long)
        self._prompt_mask = torch.zeros(0, 0, dtype=long)
        self._completion_ids = torch.zeros(0, 0, dtype=long)
        self._completion_mask = torch.zeros(0, 0, dtype=long)
        self._loss_mask = torch.zeros(0, 0, dtype=long)
        self._baseline = torch.zeros(0, 0, dtype=f64)  # (K, T), 0 off the loss mask
        self._has_baseline = torch.zeros(0, dtype=torch.bool)
        self._captured_step = torch.zeros(0, dtype=long)
        self._baseline_step = torch.zeros(0, dtype=long)  # -1 while no baseline
        self._pending: tuple[int, int] | None = None  # (rows, T) of the last batch()

    def __len__(self) -> int:
        return int(self._prompt_ids.shape[0])

    @property
    def full(self) -> bool:
        return len(self) >= self.capacity

    @property
    def captured_steps(self) -> list[int]:
        """Step at which each anchor was captured, in anchor order."""
        return [int(s) for s in self._captured_step.tolist()]

    @property
    def baseline_steps(self) -> list[int | None]:
        """Step of each anchor's baseline (None while it has none), in anchor order."""
        return [int(s) if s >= 0 else None for s in self._baseline_step.tolist()]

    # ------------------------------------------------------------------------------------------

    def offer(
        self,
        *,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        loss_mask: Tensor,
        rewards: Tensor,
        step: int,
        old_logp: Tensor | None = None,
    ) -> int:
        """Freeze the batch's new correct responses until the set holds `capacity` anchors.

        Args:
            prompt_ids, prompt_mask: (B, P) left-padded prompts (mask 0 on padding).
            completion_ids, completion_mask: (B, T) right-padded completions.
            loss_mask: (B, T) non-zero on the model's tokens (completion_mask * tool_mask in TRL).
            rewards: (B,) scalar rewards.
            step: training step, recorded as the anchors' capture step.
            old_logp: optional (B, T) rollout-time log-probs; when given (and finite on a row's loss
                tokens) they are that anchor's baseline, so its first `measure` already has a delta.

        Rows with reward >= `success_threshold` (NaN: no) and at least one loss-mask token are
        candidates, taken in row order; a candidate whose prompt and completion tokens (under their
        masks) equal those of a held anchor or of an earlier candidate is skipped (the loss mask is
        not part of the identity). The kept rows lose the padding columns all candidates share, and
        are copied to the CPU with every padding position set to `pad_token_id`.

        Returns:
            The number of anchors added.

        Raises:
            ValueError: on inconsistent shapes (the message names the argument).
        """
        _check_2d("prompt_ids", prompt_ids, None)
        batch, p_width = prompt_ids.shape
        _check_2d("prompt_mask", prompt_mask, (batch, p_width))
        _check_2d("completion_ids", completion_ids, None)
        if completion_ids.shape[0] != batch:
            raise ValueError(
                f"completion_ids must have {batch} rows like prompt_ids, got {tuple(completion_ids.shape)}"
            )
        t_width = completion_ids.shape[1]
        _check_2d("completion_mask", completion_mask, (batch, t_width))
        _check_2d("loss_mask", loss_mask, (batch, t_width))
        if old_logp is not None:
            _check_2d("old_logp", old_logp, (batch, t_width))
        if tuple(rewards.shape) != (batch,):
            raise ValueError(f"rewards must have shape {(batch,)}, got {tuple(rewards.shape)}")
        room = self.capacity - len(self)
        if room <= 0 or batch == 0:
            return 0
        with torch.no_grad():
            return self._offer(
                prompt_ids, prompt_mask, completion_ids, completion_mask, loss_mask, rewards, step, old_logp
            )

    def _offer(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        loss_mask: Tensor,
        rewards: Tensor,
        step: int,
        old_logp: Tensor | None,
    ) -> int:
        lm_dev = loss_mask != 0
        ok = (rewards >= self.success_threshold) & lm_dev.any(dim=1)  # NaN >= x is False
        rows = ok.nonzero().squeeze(1)  # host sync
        if rows.shape[0] == 0:
            return 0
        cpu = torch.device("cpu")
        pm = (prompt_mask[rows] != 0).to(cpu, torch.int64)
        cm = (completion_mask[rows] != 0).to(cpu, torch.int64)
        lm = lm_dev[rows].to(cpu, torch.int64)
        p_ids = prompt_ids[rows].to(cpu, torch.int64)
        c_ids = completion_ids[rows].to(cpu, torch.int64)

        # Trim the candidates' common padding: prompt columns left of every real prompt token,
        # completion columns right of every real completion/loss token.
        p_used = pm.any(dim=0).to(torch.int64)
        c_used = (cm | lm).any(dim=0).to(torch.int64)
        lead = (p_used.cumsum(0) == 0).sum()  # all-padding prompt columns on the left
        trail = (c_used.flip(0).cumsum(0) == 0).sum()  # all-padding completion columns on the right
        p_start, t_cut = (int(x) for x in torch.stack([lead, trail]).tolist())
        t_end = cm.shape[1] - t_cut
        pm, p_ids = pm[:, p_start:], p_ids[:, p_start:]
        cm, lm, c_ids = cm[:, :t_end], lm[:, :t_end], c_ids[:, :t_end]
        pad = self.pad_token_id
        p_ids = torch.where(pm != 0, p_ids, pad)  # all padding holds `pad_token_id`
        c_ids = torch.where(cm != 0, c_ids, pad)

        # Common widths with the held anchors; duplicates compared on (tokens * mask, mask).
        width_p = max(pm.shape[1], self._prompt_ids.shape[1])
        width_t = max(cm.shape[1], self._completion_ids.shape[1])
        pm, p_ids = _left_pad(pm, width_p, 0), _left_pad(p_ids, width_p, pad)
        cm, lm, c_ids = (
            _right_pad(cm, width_t, 0),
            _right_pad(lm, width_t, 0),
            _right_pad(c_ids, width_t, pad),
        )

        def identity(pi: Tensor, pmk: Tensor, ci: Tensor, cmk: Tensor) -> Tensor:
            pi, pmk = _left_pad(pi, width_p, 0), _left_pad(pmk, width_p, 0)
            ci, cmk = _right_pad(ci, width_t, 0), _right_pad(cmk, width_t, 0)
            return torch.cat([pi * pmk, pmk, ci * cmk, cmk], dim=1)

        held = identity(self._prompt_ids, self._prompt_mask, self._completion_ids, self._completion_mask)
        new = _first_unique(held, identity(p_ids, pm, c_ids, cm))
        keep = new.nonzero().squeeze(1)[: self.capacity - len(self)]
        added = int(keep.shape[0])
        if added == 0:
            return 0
        self._widen(width_p, width_t)

        baseline = torch.zeros(added, width_t, dtype=torch.float64)
        has_baseline = torch.zeros(added, dtype=torch.bool)
        if old_logp is not None:
            old = _right_pad(old_logp[rows].detach().to(cpu, torch.float64)[:, :t_end], width_t, 0.0)[keep]
            on = lm[keep] != 0
            has_baseline = (torch.isfinite(old) | ~on).all(dim=1)
            baseline = torch.where(on & has_baseline[:, None], old, baseline)
        self._prompt_ids = torch.cat([self._prompt_ids, p_ids[keep]])
        self._prompt_mask = torch.cat([self._prompt_mask, pm[keep]])
        self._completion_ids = torch.cat([self._completion_ids, c_ids[keep]])
        self._completion_mask = torch.cat([self._completion_mask, cm[keep]])
        self._loss_mask = torch.cat([self._loss_mask, lm[keep]])
        self._baseline = torch.cat([self._baseline, baseline])
        self._has_baseline = torch.cat([self._has_baseline, has_baseline])
        self._captured_step = torch.cat([self._captured_step, torch.full((added,), step, dtype=torch.int64)])
        baseline_step = torch.where(
            has_baseline, torch.full((added,), step, dtype=torch.int64), torch.full((added,), -1)
        )
        self._baseline_step = torch.cat([self._baseline_step, baseline_step])
        return added

    def _widen(self, width_p: int, width_t: int) -> None:
        """Re-pad the held anchors to prompt width `width_p` (left) and completion width `width_t` (right)."""
        pad = self.pad_token_id
        self._prompt_ids = _left_pad(self._prompt_ids, width_p, pad)
        self._prompt_mask = _left_pad(self._prompt_mask, width_p, 0)
        self._completion_ids = _right_pad(self._completion_ids, width_t, pad)
        self._completion_mask = _right_pad(self._completion_mask, width_t, 0)
        self._loss_mask = _right_pad(self._loss_mask, width_t, 0)
        self._baseline = _right_pad(self._baseline, width_t, 0.0)

    # ------------------------------------------------------------------------------------------

    def batch(self, device: torch.device | str | None = None) -> AnchorBatch:
        """All anchors as one forward-pass batch on `device` (default CPU); `measure` expects its rows.

        Widths are the tightest common ones (each anchor was trimmed to its own padding when
        captured), prompts left-padded and completions right-padded with `pad_token_id`.
        """
        dev = torch.device("cpu") if device is None else torch.device(device)
        width = int(self._completion_ids.shape[1])
        self._pending = (len(self), width)
        return AnchorBatch(
            input_ids=torch.cat([self._prompt_ids, self._completion_ids], dim=1).to(dev),
            attention_mask=torch.cat([self._prompt_mask, self._completion_mask], dim=1).to(dev),
            logits_to_keep=width,
            loss_mask=self._loss_mask.to(dev),
        )

    def measure(self, new_logp: Tensor, step: int) -> dict[str, float]:
        """Metrics of the anchors of the last `batch()`, from their per-token log-probs under the current policy.

        Args:
            new_logp: (K, T) log-probs of the completion tokens of the last `batch()`'s rows (T =
                its `logits_to_keep`); any device and floating dtype; values off the loss mask are
                never read.
            step: training step, recorded as the step of the baselines set by this call.

        Returns:
            `M.ANCHOR_LOGP` (token-weighted mean of `new_logp` over every anchor's loss tokens),
            `M.ANCHOR_SIZE` (K) and, over the anchors that had a baseline before this call,
            `M.ANCHOR_DELTA` (token-weighted mean of new - baseline) and `M.ANCHOR_FRAC_DECREASED`
            (share with D_traj = sum(new - baseline) < eps; NaN if some D_traj is NaN). NaN/inf in
            `new_logp` propagate (collapse signals). Empty set: {}. Anchors without a baseline take
            this call's values when those are finite on all their loss tokens.

        Raises:
            RuntimeError: if `batch()` was not called since the last `measure`.
            ValueError: if `new_logp` is not (K, T) for that batch.
        """
        if self._pending is None:
            raise RuntimeError("AnchorSet.measure needs a batch(): call batch() and score it first")
        rows, width = self._pending
        if tuple(new_logp.shape) != (rows, width):
            raise ValueError(
                f"new_logp must have shape {(rows, width)} (the last batch()), got {tuple(new_logp.shape)}"
            )
        self._pending = None
        if rows == 0:
            return {}
        with torch.no_grad():
            new = new_logp.detach().to("cpu", torch.float64)  # host sync: the only one
            on = self._loss_mask[:rows, :width] != 0
            base = self._baseline[:rows, :width]
            had = self._has_baseline[:rows]
            zero = torch.zeros((), dtype=torch.float64)
            tok = torch.where(on, new, zero)
            logp = tok.sum() / on.sum()
            d = torch.where(on & had[:, None], tok - base, zero)
            d_traj = d.sum(dim=1)
            n_had = int(had.sum())
            out = {M.ANCHOR_LOGP: float(logp), M.ANCHOR_SIZE: float(rows)}
            if n_had:
                out[M.ANCHOR_DELTA] = float(d.sum() / (on & had[:, None]).sum())
                has_nan = bool((torch.isnan(d_traj) & had).any())
                share = float(((d_traj < self.eps) & had).sum()) / n_had
                out[M.ANCHOR_FRAC_DECREASED] = math.nan if has_nan else share
            # First finite measurement of an anchor becomes its baseline.
            first = ~had & (torch.isfinite(new) | ~on).all(dim=1)
            self._baseline[:rows, :width] = torch.where(first[:, None], tok, base)
            self._has_baseline[:rows] |= first
            self._baseline_step[:rows] = torch.where(
                first, torch.full((rows,), step, dtype=torch.int64), self._baseline_step[:rows]
            )
        return out

    # ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Anchors, baselines and steps (CPU tensor clones), for checkpointing."""
        state: dict[str, Any] = {"version": _STATE_VERSION}
        for key in _TENSOR_KEYS:
            state[key] = getattr(self, f"_{key}").clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output. The constructor's settings stay; anchors beyond `capacity`
        (a resumed run with a smaller K) are dropped, the earliest kept.

        Raises:
            ValueError: on an unknown version, a missing key or inconsistent shapes.
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported anchor state version {state.get('version')!r}")
        missing = [key for key in _TENSOR_KEYS if key not in state]
        if missing:
            raise ValueError(f"anchor state lacks {missing}")
        t: dict[str, Tensor] = {key: torch.as_tensor(state[key]).detach().cpu() for key in _TENSOR_KEYS}
        k = t["prompt_ids"].shape[0]
        p_width = t["prompt_ids"].shape[1] if t["prompt_ids"].dim() == 2 else -1
        t_width = t["completion_ids"].shape[1] if t["completion_ids"].dim() == 2 else -1
        shapes = {
            "prompt_ids": (k, p_width),
            "prompt_mask": (k, p_width),
            "completion_ids": (k, t_width),
            "completion_mask": (k, t_width),
            "loss_mask": (k, t_width),
            "baseline": (k, t_width),
            "has_baseline": (k,),
            "captured_step": (k,),
            "baseline_step": (k,),
        }
        for key, shape in shapes.items():
            if tuple(t[key].shape) != shape:
                raise ValueError(f"anchor state {key} must have shape {shape}, got {tuple(t[key].shape)}")
        keep = min(k, self.capacity)
        self._clear()
        for key in _TENSOR_KEYS:
            value = t[key][:keep]
            dtype = {"baseline": torch.float64, "has_baseline": torch.bool}.get(key, torch.int64)
            setattr(self, f"_{key}", value.to(dtype).clone())
