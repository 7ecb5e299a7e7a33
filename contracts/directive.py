"""The directive: what the service wants the trainer to do now (switch LLDS, save a checkpoint, roll
back to a checkpoint, stop), its wire shape and its one parser, shared by the service (`monitor`) and
the trainer side (`trainer_hooks`).

Wire shape (the `directive` of an ingest acknowledgement, GET /runs/{id}/directive)::

    {"llds": {"enabled": true, "lam": 0.2}, "version": 7, "reason": "phase II: LLD",
     "source": "detector", "step": 120,
     "checkpoint": 6, "stop": 0, "stop_reason": "", "stop_on_collapse": false,
     "rollback": 7, "rollback_to": 96, "lr_scale": 0.5, "applied_version": 5}

`checkpoint`, `rollback` and `stop` are request ids: the version of the directive that asked for them (0: never asked;
a later request gets a larger id), so a trainer acts once per request (`LeverTracker`), and a restarted
trainer does not repeat what one before it acknowledged: `applied_version` is the highest version any
trainer of the run acknowledged, by logging it as the metric `APPLIED_VERSION_METRIC`. Servers older
than these levers send none of them: they read as 0 / "" / false / None / 1.0.

A rollback request asks the trainer to restore its newest checkpoint saved at or before step
`rollback_to` and continue from there, with its learning rate multiplied by `lr_scale` (a factor on the
learning rate the job was started with; 1.0: unchanged). A trainer that did so logs
`ROLLBACK_METRIC` (the restored checkpoint's step) with the first step it trains again, which is how the
service learns which steps are being redone.

verl's directive file holds the same object or only its LLDS part, flat: `{"enabled": true, "lam": 0.2}`.
`parse_directive` reads all of them (and `Directive` objects, or objects with the same attributes).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "APPLIED_VERSION_METRIC",
    "DEFAULT_LLDS_LAMBDA",
    "MAX_LLDS_LAMBDA",
    "MAX_REASON_CHARS",
    "ROLLBACK_METRIC",
    "SOURCE_DEFAULT",
    "SOURCE_DETECTOR",
    "SOURCE_MANUAL",
    "Directive",
    "LLDSDirective",
    "LeverTracker",
    "Levers",
    "directive_problem",
    "parse_directive",
]

DEFAULT_LLDS_LAMBDA: Final = 0.2
"""LLDS weight lambda ([LLD] Sec. 5.5, docs/science.md section 4: 0.2; 0.3 for Qwen2.5-7B-Instruct;
0.01 only delays collapse)."""

MAX_LLDS_LAMBDA: Final = 1e6
"""The largest lambda a person may set: far beyond any useful weight (the paper's is 0.2), small enough
that the term cannot overflow a float32 loss by itself."""
MAX_REASON_CHARS: Final = 2000
"""The longest reason a directive change may carry (it is shown in the dashboard, CLI and payloads)."""


def directive_problem(lam: float | None = None, reason: str | None = None) -> tuple[str, str] | None:
    """(field, what is wrong) for a manual directive change a person asked for, None if it is fine: the
    one rule that the API, the local and remote CLI and the dashboard apply."""
    if lam is not None and not (math.isfinite(lam) and 0 <= lam <= MAX_LLDS_LAMBDA):
        return "lam", f"lambda must be a finite number in [0, {MAX_LLDS_LAMBDA:g}], got {lam!r}"
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        return "reason", f"the reason is {len(reason)} characters long; at most {MAX_REASON_CHARS}"
    if reason is not None and "\x00" in reason:
        return "reason", "the reason contains a NUL character"
    return None


APPLIED_VERSION_METRIC: Final = "directive/applied_version"
"""The trainer's acknowledgement: the highest directive version it applied, logged with its next metrics."""

ROLLBACK_METRIC: Final = "directive/rollback_to"
"""Logged by a trainer that restored a checkpoint for a rollback request, with the first step it trains
again: the restored checkpoint's step (steps after it are being redone)."""

SOURCE_DEFAULT: Final = "default"
"""Who made a directive version: nobody yet (version 0), ..."""
SOURCE_DETECTOR: Final = "detector"
"""... the service's policy (`auto`, stop-on-collapse), ..."""
SOURCE_MANUAL: Final = "manual"
"""... or a person (API, CLI, dashboard)."""


@dataclass(frozen=True)
class LLDSDirective:
    enabled: bool = False
    lam: float = DEFAULT_LLDS_LAMBDA

    def to_wire(self) -> dict[str, object]:
        """The wire shape of the LLDS switch (the `llds` of a directive, of PUT /directive's body)."""
        return {"enabled": self.enabled, "lam": self.lam}


@dataclass(frozen=True)
class Directive:
    """What the service wants the trainer to do now (the latest one an acknowledgement carried)."""

    llds: LLDSDirective = field(default_factory=LLDSDirective)
    version: int = 0
    reason: str = "default"
    source: str = SOURCE_DEFAULT
    step: int | None = None
    checkpoint: int = 0
    """Id of the latest checkpoint request (the version that made it); 0: none."""
    stop: int = 0
    """Id of the standing stop request (the version that made it); 0: none."""
    stop_reason: str = ""
    stop_on_collapse: bool = False
    """Whether the service requests a stop when the run enters collapse (opt-in per run)."""
    rollback: int = 0
    """Id of the latest rollback request (the version that made it); 0: none."""
    rollback_to: int | None = None
    """The rollback request's step: restore the newest checkpoint saved at or before it."""
    lr_scale: float = 1.0
    """Factor on the learning rate the job was started with, applied when it restores a checkpoint."""
    applied_version: int = 0
    """The highest version a trainer of this run acknowledged (`APPLIED_VERSION_METRIC`)."""

    def to_wire(self) -> dict[str, object]:
        """The wire shape (what verl's directive file holds)."""
        return {
            "llds": self.llds.to_wire(),
            "version": self.version,
            "reason": self.reason,
            "source": self.source,
            "step": self.step,
            "checkpoint": self.checkpoint,
            "stop": self.stop,
            "stop_reason": self.stop_reason,
            "stop_on_collapse": self.stop_on_collapse,
            "rollback": self.rollback,
            "rollback_to": self.rollback_to,
            "lr_scale": self.lr_scale,
            "applied_version": self.applied_version,
        }


@dataclass(frozen=True)
class Levers:
    """What a trainer should do now, once: save a checkpoint, roll back (restore the newest checkpoint
    at or before `rollback_to`, learning rate times `lr_scale`), stop (after saving), and which
    directive version to acknowledge (None: nothing new)."""

    checkpoint: bool = False
    stop: bool = False
    stop_reason: str = ""
    acknowledge: int | None = None
    rollback: bool = False
    rollback_to: int | None = None
    lr_scale: float = 1.0

    def metrics(self) -> dict[str, float]:
        """The acknowledgement as metrics to log with the step (empty if there is nothing to acknowledge)."""
        return {} if self.acknowledge is None else {APPLIED_VERSION_METRIC: float(self.acknowledge)}


class LeverTracker:
    """Turns the directives a trainer sees into `Levers`, acting once per checkpoint/rollback/stop request.

    A request counts as done when this tracker already returned it or when its id is at most the
    run's `applied_version` (a trainer before a restart acknowledged it). Not thread-safe: one per loop.
    """

    def __init__(self) -> None:
        self._checkpoint = 0
        self._stop = 0
        self._rollback = 0
        self._acknowledged = 0

    def take(self, directive: object) -> Levers:
        """The levers of `directive` (anything `parse_directive` reads) not acted upon yet."""
        d = parse_directive(directive)
        if d is None:
            return Levers()
        done = d.applied_version
        checkpoint = d.checkpoint > max(self._checkpoint, done)
        stop = d.stop > max(self._stop, done)
        rollback = d.rollback > max(self._rollback, done) and d.rollback_to is not None
        self._checkpoint = max(self._checkpoint, d.checkpoint)
        self._stop = max(self._stop, d.stop)
        self._rollback = max(self._rollback, d.rollback)
        acknowledge = None
        if d.version > max(self._acknowledged, done):
            acknowledge = self._acknowledged = d.version
        return Levers(
            checkpoint,
            stop,
            d.stop_reason if stop else "",
            acknowledge,
            rollback,
            d.rollback_to if rollback else None,
            d.lr_scale,
        )


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

    Accepts a `Directive`, the wire shape (module docstring; as a mapping or as attributes), or the
    flat `{"enabled": bool, "lam": number}` of verl's directive file. Strict: `enabled` must be a bool,
    `lam` a real finite number >= 0 (not a bool), `version` and `step` integers, the request ids and
    `applied_version` integers >= 0, `stop_on_collapse` a bool, `rollback_to` an integer >= 0 or null,
    `lr_scale` a finite number > 0, when present. Missing optional fields (an older server): version 0,
    reason "", source "", step None, no requests, rollback_to None, lr_scale 1.0, applied_version 0.
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
        counters = []
        for key in ("checkpoint", "stop", "applied_version", "rollback"):
            raw = _get(obj, key)
            count = 0 if raw is _MISSING or raw is None else _integer(raw)
            if count is None or count < 0:
                return None
            counters.append(count)
        stop_reason = _get(obj, "stop_reason")
        stop_reason = "" if stop_reason is _MISSING or stop_reason is None else stop_reason
        stop_on_collapse = _get(obj, "stop_on_collapse")
        stop_on_collapse = (
            False if stop_on_collapse is _MISSING or stop_on_collapse is None else stop_on_collapse
        )
        if not isinstance(stop_reason, str) or not isinstance(stop_on_collapse, bool):
            return None
        raw_to = _get(obj, "rollback_to")
        rollback_to = None if raw_to is _MISSING or raw_to is None else _integer(raw_to)
        if (rollback_to is None and raw_to not in (_MISSING, None)) or (rollback_to or 0) < 0:
            return None
        raw_scale = _get(obj, "lr_scale")
        if raw_scale is _MISSING or raw_scale is None:
            lr_scale = 1.0
        elif isinstance(raw_scale, bool) or not isinstance(raw_scale, numbers.Real):
            return None
        else:
            lr_scale = float(raw_scale)
        if not (math.isfinite(lr_scale) and lr_scale > 0):
            return None
    except Exception:  # a hostile object (a property that raises, an overflowing number)
        return None
    return Directive(
        llds=LLDSDirective(enabled=enabled, lam=lam_f),
        version=version,
        reason=texts[0],
        source=texts[1],
        step=step,
        checkpoint=counters[0],
        stop=counters[1],
        stop_reason=stop_reason,
        stop_on_collapse=stop_on_collapse,
        rollback=counters[3],
        rollback_to=rollback_to,
        lr_scale=lr_scale,
        applied_version=counters[2],
    )
