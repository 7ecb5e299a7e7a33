"""The directive: what the service wants the trainer to do now (switch LLDS), its wire shape and its
one parser, shared by the service (`monitor`) and the trainer side (`trainer_hooks`).

Wire shape (the `directive` of an ingest acknowledgement, GET /runs/{id}/directive)::

    {"llds": {"enabled": true, "lam": 0.2}, "version": 3, "reason": "phase II: LLD",
     "source": "policy", "step": 120}

verl's directive file holds the same object or only its LLDS part, flat: `{"enabled": true, "lam": 0.2}`.
`parse_directive` reads all of them (and `Directive` objects, or objects with the same attributes).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = ["DEFAULT_LLDS_LAMBDA", "Directive", "LLDSDirective", "parse_directive"]

DEFAULT_LLDS_LAMBDA: Final = 0.2
"""LLDS weight lambda ([LLD] Sec. 5.5, lld-reference.md section 4: 0.2; 0.3 for Qwen2.5-7B-Instruct;
0.01 only delays collapse)."""


@dataclass(frozen=True)
class LLDSDirective:
    enabled: bool = False
    lam: float = DEFAULT_LLDS_LAMBDA


@dataclass(frozen=True)
class Directive:
    """What the service wants the trainer to do now (the latest one an acknowledgement carried)."""

    llds: LLDSDirective = field(default_factory=LLDSDirective)
    version: int = 0
    reason: str = "default"
    source: str = "default"
    step: int | None = None


_MISSING: Final = object()


def _get(obj: object, key: str) -> object:
    if isinstance(obj, Mapping):
        return obj.get(key, _MISSING)
    return getattr(obj, key, _MISSING)


def _integer(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def parse_directive(obj: object) -> Directive | None:
    """The directive in `obj`, or None if there is none or it is malformed.

    Accepts a `Directive`, the wire shape `{"llds": {"enabled": bool, "lam": number}, "version": int,
    "reason": str, "source": str, "step": int | null}` (as a mapping or as attributes), or the flat
    `{"enabled": bool, "lam": number}` of verl's directive file. Strict: `enabled` must be a bool, `lam` a
    real finite number >= 0 (not a bool), `version` and `step` integers when present. Missing optional
    fields: version 0, reason "", source "", step None.
    """
    if isinstance(obj, Directive):
        return obj
    if obj is None:
        return None
    try:
        llds = _get(obj, "llds")
        if llds is _MISSING or llds is None:
            llds = obj  # the flat form
        enabled = _get(llds, "enabled")
        lam = _get(llds, "lam")
        if not isinstance(enabled, bool) or isinstance(lam, bool) or not isinstance(lam, numbers.Real):
            return None
        lam_f = float(lam)
        if not math.isfinite(lam_f) or lam_f < 0:
            return None
        raw_version = _get(obj, "version")
        version = 0 if raw_version is _MISSING or raw_version is None else _integer(raw_version)
        raw_step = _get(obj, "step")
        step = None if raw_step is _MISSING or raw_step is None else _integer(raw_step)
        if version is None or (step is None and raw_step not in (_MISSING, None)):
            return None
        texts = []
        for key in ("reason", "source"):
            text = _get(obj, key)
            if text is _MISSING or text is None:
                text = ""
            if not isinstance(text, str):
                return None
            texts.append(text)
    except Exception:  # a hostile object (a property that raises, an overflowing number)
        return None
    return Directive(
        llds=LLDSDirective(enabled=enabled, lam=lam_f),
        version=version,
        reason=texts[0],
        source=texts[1],
        step=step,
    )
