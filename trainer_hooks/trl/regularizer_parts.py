"""Trainer-agnostic pieces of the LLDS / SAPO term in `trainer_hooks.trl`: settings, answer spans,
directives, the accumulation scaling and the per-step statistics.

Pure torch and `re` (no trl/transformers import), so every piece is unit-testable on its own;
`trainer_hooks.trl.MonitoredGRPOTrainer` wires them into TRL's loss (docs/hooks-trl.md documents
the user-facing options). The regularisers themselves are `trainer_hooks.regularizers`.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

import torch
from torch import Tensor

from contracts import metrics as M
from contracts.directive import DEFAULT_LLDS_LAMBDA, parse_directive
from trainer_hooks.regularizers import Gate, LLDSStats, Normalize, SAPOStats, ma_beta

__all__ = [
    "DEFAULT_ANSWER_PATTERN",
    "GLOBAL_TOKEN_LOSS_TYPES",
    "SAPO_LOSS",
    "SAPO_SELECTED_TOKEN_FRAC",
    "SAPO_WEIGHT",
    "AnswerWeight",
    "LLDSMode",
    "LLDSSwitch",
    "MASchedule",
    "RegularizerSettings",
    "RegularizerStep",
    "answer_token_mask",
    "ma_answer_weight",
    "read_directive",
    "term_scale",
    "valid_searches_from_mask",
]

LLDSMode = Literal["off", "on", "auto"]
AnswerWeight = float | Literal["ma"]
MASchedule = Literal["paper", "code"]
_MA_SCHEDULES: Final[tuple[str, ...]] = get_args(MASchedule)

DEFAULT_ANSWER_PATTERN: Final = r"<answer>.*?</answer>"
"""Final-answer span of Search-R1-style agents (compiled with re.DOTALL: answers may span lines)."""

GLOBAL_TOKEN_LOSS_TYPES: Final = frozenset({"dapo", "cispo", "vespo"})
"""TRL 1.16 loss types normalised by the token count of the whole accumulation window
(`num_items_in_batch`); every other loss type is a per-micro-batch mean divided by the number of
accumulation steps (see `term_scale`)."""

# SAPO's term has no canonical metric names (contracts.metrics); these pass through as they are.
SAPO_LOSS: Final = "sapo/loss"
SAPO_WEIGHT: Final = "sapo/weight"
SAPO_SELECTED_TOKEN_FRAC: Final = "sapo/selected_token_frac"

_MODES: Final[tuple[str, ...]] = get_args(LLDSMode)
_GATES: Final[tuple[str, ...]] = get_args(Gate)
_NORMALIZES: Final[tuple[str, ...]] = get_args(Normalize)


def _real(name: str, value: object, *, positive: bool = False) -> float:
    """`value` as a finite float >= 0 (> 0 with `positive`); ValueError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out < 0 or (positive and out == 0):
        raise ValueError(f"{name} must be finite and {'> 0' if positive else '>= 0'}, got {value!r}")
    return out


@dataclass(frozen=True)
class RegularizerSettings:
    """Validated static LLDS/SAPO options of `MonitoredGRPOTrainer` (see `trainer_hooks.trl`).

    Attributes:
        mode: "off" | "on" (always, with `lam`) | "auto" (the sink's directive switches it).
        lam: LLDS weight lambda of mode "on" ("auto" takes the directive's).
        gate, normalize: `trainer_hooks.regularizers.llds_loss` options.
        answer_weight: beta of answer-span tokens (LLDS-MA), a float >= 0 or "ma" (`ma_beta` of
            the rollout's valid searches per trajectory).
        answer_pattern: the answer span is the final match of this regex in the decoded completion.
        ma_schedule: beta schedule of answer_weight="ma" (`regularizers.ma_beta`).
        sapo_weight: weight w of `sapo_kl_loss` (0: off); independent of `mode`.
        sapo_threshold: its ratio threshold t (required when `sapo_weight` > 0).
        sapo_normalize: SAPO's own normalisation (independent of LLDS's `normalize`).
    """

    mode: LLDSMode = "off"
    lam: float = DEFAULT_LLDS_LAMBDA
    gate: Gate = "action"
    answer_weight: AnswerWeight = 1.0
    normalize: Normalize = "loss_tokens"
    answer_pattern: re.Pattern[str] = re.compile(DEFAULT_ANSWER_PATTERN, re.DOTALL)
    sapo_weight: float = 0.0
    sapo_threshold: float | None = None
    ma_schedule: MASchedule = "paper"
    sapo_normalize: Normalize = "preserving_tokens"

    @classmethod
    def build(
        cls,
        *,
        llds: str | None,
        llds_lambda: object,
        llds_gate: object,
        llds_answer_weight: object,
        llds_normalize: object,
        answer_pattern: object,
        sapo_weight: object,
        sapo_threshold: object,
        sink_has_directive: bool,
        llds_ma_schedule: object = "paper",
        sapo_normalize: object = "preserving_tokens",
    ) -> RegularizerSettings:
        """Validate the constructor arguments; `llds=None` means "auto" if the sink has a
        `directive`, else "off".

        Raises:
            ValueError: naming the argument (unknown mode/gate/normalize, negative or non-finite
                lambda/weights, a regex that does not compile, "auto" without a directive).
        """
        if llds is None:
            mode = "auto" if sink_has_directive else "off"
        elif llds in _MODES:
            mode = llds
            if mode == "auto" and not sink_has_directive:
                raise ValueError(
                    'llds="auto" needs an lldmon_sink with a `directive` property (e.g. MonitorClient); '
                    'use llds="on" to switch LLDS on statically'
                )
        else:
            raise ValueError(f"llds must be one of {_MODES}, got {llds!r}")
        lam = _real("llds_lambda", llds_lambda)
        if llds_gate not in _GATES:
            raise ValueError(f"llds_gate must be one of {_GATES}, got {llds_gate!r}")
        if llds_normalize not in _NORMALIZES:
            raise ValueError(f"llds_normalize must be one of {_NORMALIZES}, got {llds_normalize!r}")
        if sapo_normalize not in _NORMALIZES:
            raise ValueError(f"sapo_normalize must be one of {_NORMALIZES}, got {sapo_normalize!r}")
        if llds_ma_schedule not in _MA_SCHEDULES:
            raise ValueError(f"llds_ma_schedule must be one of {_MA_SCHEDULES}, got {llds_ma_schedule!r}")
        answer_weight: AnswerWeight
        if isinstance(llds_answer_weight, str):
            if llds_answer_weight.strip().lower() != "ma":
                raise ValueError(
                    f'llds_answer_weight must be a number >= 0 or "ma", got {llds_answer_weight!r}'
                )
            answer_weight = "ma"
        else:
            answer_weight = _real("llds_answer_weight", llds_answer_weight)
        pattern = _compile(answer_pattern)
        w = _real("sapo_weight", sapo_weight)
        threshold: float | None = None
        if sapo_threshold is not None:
            threshold = _real("sapo_threshold", sapo_threshold, positive=True)
        elif w > 0:
            raise ValueError(
                "sapo_threshold must be set when sapo_weight > 0 (SAPO's threshold is unpublished: "
                "choose it, e.g. slightly below 1)"
            )
        return cls(
            mode=mode,  # type: ignore[arg-type]  # checked against _MODES
            lam=lam,
            gate=llds_gate,  # type: ignore[arg-type]
            answer_weight=answer_weight,
            normalize=llds_normalize,  # type: ignore[arg-type]
            answer_pattern=pattern,
            sapo_weight=w,
            sapo_threshold=threshold,
            ma_schedule=llds_ma_schedule,  # type: ignore[arg-type]
            sapo_normalize=sapo_normalize,  # type: ignore[arg-type]
        )

    @property
    def any_on(self) -> bool:
        """Whether any term may be added at some step (LLDS on/auto, or SAPO)."""
        return self.mode != "off" or self.sapo_weight > 0

    @property
    def needs_answer_mask(self) -> bool:
        return self.mode != "off" and self.answer_weight != 1.0


def _compile(pattern: object) -> re.Pattern[str]:
    if isinstance(pattern, re.Pattern):
        if not isinstance(pattern.pattern, str):
            raise ValueError(f"answer_pattern must be a str pattern, got {pattern!r}")
        return pattern
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"answer_pattern must be a non-empty regex string, got {pattern!r}")
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"answer_pattern {pattern!r} is not a valid regex: {exc}") from exc


# ----------------------------------------------------------------------------------------------
# answer spans


def _final_match(pattern: re.Pattern[str], text: str) -> tuple[int, int] | None:
    """Character span of the last non-empty match of `pattern` in `text`."""
    span = None
    for match in pattern.finditer(text):
        if match.end() > match.start():
            span = match.span()
    return span


def answer_token_mask(
    tokenizer: Any,
    completion_ids: Tensor,
    completion_mask: Tensor,
    pattern: re.Pattern[str],
) -> Tensor:
    """(B, T) bool: the tokens of the FINAL match of `pattern` in each decoded completion.

    Each row (up to its last `completion_mask` token) is decoded once, with special tokens and
    without clean-up, in one `batch_decode` call, and searched for its last match [s, e). The
    character span is mapped to tokens by decoding token *prefixes*: with L(k) the length of the
    decoded first k tokens, token i covers characters [L(i), L(i+1)), and it belongs to the answer
    iff L(i) < e and L(i+1) > s. Both boundaries are found by bisection on k, batched over all
    matching rows (one `batch_decode` per bisection level, about 2 * log2(T) calls per rollout
    batch), so the cost does not grow with T^2 and no Python loop runs per token. Decoding
    prefixes, unlike re-encoding the text, maps the tokens the model actually sampled; a token
    split inside a multi-byte character counts as covering it. Rows without a match are all False.
    """
    batch, width = completion_ids.shape
    out = torch.zeros(batch, width, dtype=torch.bool, device=completion_ids.device)
    if batch == 0 or width == 0:
        return out
    positions = torch.arange(width, device=completion_mask.device)
    last = torch.where(completion_mask != 0, positions, torch.full_like(positions, -1)).amax(dim=1) + 1
    lengths: list[int] = last.cpu().tolist()
    id_rows: list[list[int]] = completion_ids.cpu().tolist()
    rows = [ids[:n] for ids, n in zip(id_rows, lengths, strict=True)]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # bisection queries: (row, target); answer = min{k in [0, n]: L(k) >= target}
    query_rows: list[int] = []
    targets: list[int] = []
    for r, text in enumerate(texts):
        span = _final_match(pattern, text)
        if span is not None:
            query_rows += [r, r]
            targets += [span[0] + 1, span[1]]  # L(i+1) > s  <=>  L(i+1) >= s + 1
    if not query_rows:
        return out
    lo = [0] * len(query_rows)
    hi = [lengths[r] for r in query_rows]
    while True:
        active = [q for q in range(len(query_rows)) if lo[q] < hi[q]]
        if not active:
            break
        mids = [(lo[q] + hi[q]) // 2 for q in active]
        prefixes = [rows[query_rows[q]][:mid] for q, mid in zip(active, mids, strict=True)]
        decoded = tokenizer.batch_decode(
            prefixes, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        for q, mid, text in zip(active, mids, decoded, strict=True):
            if len(text) >= targets[q]:
                hi[q] = mid
            else:
                lo[q] = mid + 1
    start = torch.zeros(batch, dtype=torch.int64)
    end = torch.zeros(batch, dtype=torch.int64)
    for q in range(0, len(query_rows), 2):
        r = query_rows[q]
        start[r] = max(lo[q] - 1, 0)
        end[r] = lo[q + 1]
    start, end = start.to(out.device), end.to(out.device)
    cols = torch.arange(width, device=out.device)
    return (cols >= start[:, None]) & (cols < end[:, None])


def valid_searches_from_mask(loss_mask: Tensor) -> float:
    """Mean tool calls per trajectory counted from a loss mask: actions - 1 per row with an action.

    The fallback V_s of LLDS-MA when TRL logs no `tools/*` metrics (e.g. a `rollout_func` with an
    `env_mask`); counts every call, valid or not. NaN for a batch without any action.
    """
    valid = loss_mask != 0
    starts = valid & ~torch.nn.functional.pad(valid[:, :-1], (1, 0), value=False)
    n_act = starts.sum(dim=1)
    rows = n_act > 0
    n_rows = int(rows.sum().item())
    if n_rows == 0:
        return math.nan
    return float((n_act[rows] - 1).double().sum().item()) / n_rows


def ma_answer_weight(
    call_frequency: float | None,
    failure_frequency: float | None,
    loss_mask: Tensor,
    *,
    schedule: MASchedule = "paper",
) -> tuple[float, float]:
    """(V_s, beta) of LLDS-MA for one rollout batch.

    V_s = TRL's `tools/call_frequency` * (1 - `tools/failure_frequency`) (valid tool calls per
    trajectory over all processes, the `search/valid_per_traj` metric) when TRL logged it for this
    rollout, else `valid_searches_from_mask`; beta = `ma_beta(V_s, schedule)`.
    """
    if call_frequency is not None and math.isfinite(call_frequency):
        failures = failure_frequency if failure_frequency is not None else 0.0
        v_s = call_frequency * (1.0 - failures)
    else:
        v_s = valid_searches_from_mask(loss_mask)
    return v_s, ma_beta(v_s, schedule=schedule)


# ----------------------------------------------------------------------------------------------
# directive


@dataclass(frozen=True)
class LLDSSwitch:
    """LLDS state of one optimizer step: whether it is on, its lambda, and where it came from."""

    enabled: bool
    lam: float
    version: int | None = None
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.enabled and self.lam > 0


def read_directive(sink: object) -> LLDSSwitch | None:
    """The LLDS switch of `sink.directive` (duck-typed: a `contracts.directive.Directive`, the
    service's JSON shape or the flat `{"enabled", "lam"}` form); None if the sink has no directive or
    it is malformed (`contracts.directive.parse_directive`: a bool `enabled`, a finite `lam` >= 0)."""
    directive = parse_directive(getattr(sink, "directive", None))
    if directive is None:
        return None
    return LLDSSwitch(
        enabled=directive.llds.enabled,
        lam=directive.llds.lam,
        version=directive.version,
        reason=directive.reason,
    )


# ----------------------------------------------------------------------------------------------
# accumulation scaling


def term_scale(
    *,
    loss_type: str,
    normalize: str,
    grad_accum: int,
    n_loss_tokens: Tensor,
    num_items_in_batch: Tensor | None,
    num_processes: int,
    steps_per_generation: int,
) -> Tensor | float:
    """Factor that turns a micro-batch's regulariser value into its share of the optimizer step.

    TRL 1.16 (`GRPOTrainer._compute_loss`, `loss_is_scaled_for_ga = True`) scales the policy loss
    for gradient accumulation itself, by loss type:

    - grpo, sapo, bnpo, dr_grpo, luspo: a per-micro-batch value divided by `grad_accum`
      (`current_gradient_accumulation_steps`) -> factor 1 / grad_accum, as TRL's own entropy bonus
      and auxiliary loss, and as the LLDS authors' `dp_actor.py` (`loss = policy_loss /
      gradient_accumulation` with the LLDS term inside `policy_loss`). Summed over the window the
      term is lambda * the mean of the micro-batch values.
    - dapo, cispo, vespo (`GLOBAL_TOKEN_LOSS_TYPES`): the token sum divided by the window's token
      count, `num_items_in_batch / num_processes * grad_accum / steps_per_generation`. With
      normalize="loss_tokens" the term is then n_loss_tokens / that count (the micro-batch's share of
      the window's loss tokens), i.e. the penalty's token sum normalised exactly like the policy
      tokens: summed over the window, lambda * (window penalty sum / window loss tokens), the same
      scaling `trainer_hooks.verl` uses for verl's global token normalisation. With
      "preserving_tokens" (no window-wide preserving count without a collective) it is 1 / grad_accum.

    Either way the effective weight per optimizer step is lambda, whatever the micro-batch split.
    """
    if (
        loss_type in GLOBAL_TOKEN_LOSS_TYPES
        and normalize == "loss_tokens"
        and isinstance(num_items_in_batch, Tensor)
    ):
        window = num_items_in_batch.clamp(min=1.0) / num_processes * (grad_accum / steps_per_generation)
        return n_loss_tokens.to(window.dtype) / window
    return 1.0 / grad_accum


# ----------------------------------------------------------------------------------------------
# per-step statistics


class RegularizerStep:
    """The regulariser values of one optimizer step's micro-batches; one host sync in `finish`."""

    def __init__(self) -> None:
        self._llds: list[Tensor] = []
        self._sapo: list[Tensor] = []

    def __len__(self) -> int:
        return len(self._llds) + len(self._sapo)

    def add_llds(self, loss: Tensor, stats: LLDSStats) -> None:
        n = stats.n_preserving_actions.double()
        self._llds.append(torch.stack([loss.detach().double(), stats.gated_action_frac.double() * n, n]))

    def add_sapo(self, loss: Tensor, stats: SAPOStats) -> None:
        n = stats.n_preserving_tokens.double()
        self._sapo.append(torch.stack([loss.detach().double(), stats.selected_token_frac.double() * n, n]))

    def clear(self) -> None:
        self._llds.clear()
        self._sapo.clear()

    def finish(self, *, llds: LLDSSwitch | None, sapo_weight: float) -> dict[str, float]:
        """Metrics of the step, then clear.

        `llds` (None: LLDS is not configured, no llds/* metric): `llds/active`, `llds/lambda`
        (0 when off); when it was on, `llds/loss` = mean over the step's micro-batches of
        `llds_loss` (before lambda and accumulation scaling) and `llds/gated_action_frac` over all
        their preserving actions. With `sapo_weight` > 0: `sapo/weight`, `sapo/loss`,
        `sapo/selected_token_frac`.
        """
        llds_rows, sapo_rows = self._llds, self._sapo
        self._llds, self._sapo = [], []
        values: list[list[float]] = (
            torch.stack(llds_rows + sapo_rows).tolist() if llds_rows or sapo_rows else []
        )
        out: dict[str, float] = {}
        if llds is not None:
            on = llds.active and bool(llds_rows)
            out[M.LLDS_ACTIVE] = 1.0 if on else 0.0
            out[M.LLDS_LAMBDA] = llds.lam if on else 0.0
            if on:
                out.update(_summary(values[: len(llds_rows)], M.LLDS_LOSS, M.LLDS_GATED_ACTION_FRAC))
        if sapo_weight > 0 and sapo_rows:
            out[SAPO_WEIGHT] = sapo_weight
            out.update(_summary(values[len(llds_rows) :], SAPO_LOSS, SAPO_SELECTED_TOKEN_FRAC))
        return out


def _summary(rows: Sequence[Sequence[float]], loss_name: str, frac_name: str) -> dict[str, float]:
    loss = sum(r[0] for r in rows) / len(rows)
    hits, total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    return {loss_name: loss, frac_name: hits / total if total > 0 else 0.0}
