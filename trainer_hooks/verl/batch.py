"""What the probe actor reads from verl's training batch for the loss and the probe, which the policy
loss never sees: the final `<answer>...</answer>` span of each response (found on its token ids), the
reward of each response and the rollout's valid-search count per row."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, Final

import torch
from torch import Tensor

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_MASK_KEY",
    "ANSWER_OPEN",
    "REWARDS_KEY",
    "VALID_SEARCH_KEYS",
    "AnswerSpanFinder",
    "column",
    "padded",
    "rewards_from_batch",
    "valid_searches_from_batch",
]

ANSWER_OPEN: Final = "<answer>"
ANSWER_CLOSE: Final = "</answer>"
ANSWER_MASK_KEY: Final = "lldmon_answer_mask"
"""Batch column (B, T) bool the actor adds for the loss: the final answer span of each response."""
REWARDS_KEY: Final = "lldmon_rewards"
"""Batch column (B,) float the actor adds for the loss: each response's reward."""
VALID_SEARCH_KEYS: Final = (
    "valid_search_stats",
    "number_of_valid_search",
    "num_valid_search",
    "valid_searches",
    "valid_search",
)
"""Per-row valid-search counts looked up in the batch (first found wins)."""


class AnswerSpanFinder:
    """Marks the final `<answer>...</answer>` span of responses given as token ids.

    The text of a response is the concatenation of its tokens' decoded pieces (one `decode([id])`
    per distinct id, cached), so tags split over several tokens are found too. A token belongs to
    the span when its piece overlaps [start of the last `open`, end of the first `close` after it);
    without a closing tag the span runs to the end of the response. Pieces of multi-byte characters
    split across tokens decode to replacement characters; ASCII tags are unaffected.
    """

    def __init__(self, tokenizer: Any, open_tag: str = ANSWER_OPEN, close_tag: str = ANSWER_CLOSE) -> None:
        self.tokenizer = tokenizer
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._pieces: dict[int, str] = {}

    def _piece(self, token_id: int) -> str:
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self.tokenizer.decode(
                [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            self._pieces[token_id] = piece
        return piece

    def row_span(self, ids: Sequence[int]) -> tuple[int, int] | None:
        """Token index range [first, last + 1) of the final answer span of one response, or None."""
        pieces = [self._piece(i) for i in ids]
        text = "".join(pieces)
        start = text.rfind(self.open_tag)
        if start < 0:
            return None
        close = text.find(self.close_tag, start + len(self.open_tag))
        end = len(text) if close < 0 else close + len(self.close_tag)
        ends: list[int] = []
        total = 0
        for piece in pieces:
            total += len(piece)
            ends.append(total)
        first = bisect.bisect_right(ends, start)  # first token whose end is past `start`
        last = bisect.bisect_left(ends, end)  # first token whose end reaches `end`
        return first, min(last, len(pieces) - 1) + 1

    def mask(self, responses: Tensor, lengths: Tensor) -> Tensor:
        """(B, T) bool answer-span mask of right-padded `responses` (B, T) with `lengths` (B,)."""
        out = torch.zeros(responses.shape, dtype=torch.bool)
        for row, (ids, n) in enumerate(zip(responses.tolist(), lengths.tolist(), strict=True)):
            span = self.row_span(ids[: int(n)])
            if span is not None:
                out[row, span[0] : span[1]] = True
        return out.to(responses.device)


def column(data: Any, key: str) -> Any:
    """Column `key` of a verl batch (TensorDict: tensors and non-tensor data), None if absent."""
    try:
        keys = set(data.keys())
    except Exception:
        return None
    if key not in keys:
        return None
    from verl.utils import tensordict_utils as tu

    return tu.get(data, key)


def valid_searches_from_batch(data: Any, batch: int) -> tuple[Tensor | None, str | None]:
    """(B,) float64 valid-search count per row from the first `VALID_SEARCH_KEYS` column with B
    finite values (a tensor, a per-row non-tensor column or a per-row list in meta_info), and its key."""
    for key in VALID_SEARCH_KEYS:
        value = column(data, key)
        if value is None:
            continue
        try:
            if isinstance(value, Tensor):
                t = value.detach().to("cpu", torch.float64).reshape(-1)
            else:
                t = torch.tensor([float(v) for v in value], dtype=torch.float64)
        except (TypeError, ValueError):
            continue
        if t.shape == (batch,) and bool(torch.isfinite(t).all()):
            return t, key
    return None, None


def rewards_from_batch(data: Any) -> Tensor | None:
    """(B,) reward per row: verl's `token_level_scores` summed over the response (else `rm_scores`)."""
    for key in ("token_level_scores", "rm_scores"):
        value = column(data, key)
        if isinstance(value, Tensor) and not value.is_nested:
            return value.detach().float().sum(dim=-1) if value.dim() == 2 else value.detach().float()
    return None


def padded(value: Any) -> Tensor | None:
    """A tensor column as a padded tensor (nested ones padded with 0), None if not a tensor."""
    if not isinstance(value, Tensor):
        return None
    return value.to_padded_tensor(0) if value.is_nested else value
