"""Construction-time options of `MonitoredGRPOTrainer`'s monitoring: validated once, sized from the
trainer's own `GRPOConfig`, and the sink taken from the environment when none is given."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Final

from contracts import metrics as M
from trainer_hooks._sink import MetricSink

__all__ = [
    "FROM_ENV",
    "FromEnv",
    "MonitorSettings",
    "auto_anchor_size",
    "auto_probe_size",
    "env_configured",
    "has_directive",
    "rows_per_step",
    "sink_from_env",
]


def rows_per_step(args: Any) -> int:
    """Rows trained per optimizer step on this process (8, TRL's default, when `args` is not a
    GRPOConfig yet)."""
    try:
        return int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    except (AttributeError, TypeError, ValueError):
        return 8


def auto_probe_size(rows_per_step: int) -> int:
    """Default probe size: a quarter of the rows trained per optimizer step, clamped to [2, 8]."""
    return min(max(rows_per_step // 4, 2), 8)


def auto_anchor_size(rows_per_step: int) -> int:
    """Default anchor-set size K: the rows trained per optimizer step, clamped to [8, 32]."""
    return min(max(rows_per_step, 8), M.DEFAULT_ANCHOR_SIZE)


@dataclass(frozen=True)
class MonitorSettings:
    """Validated measurement options (see `MonitoredGRPOTrainer`'s arguments)."""

    probe_size: int
    probe_interval: int
    max_action_records: int
    eps: float
    probe_seed: int
    success_threshold: float | None
    anchor_size: int
    anchor_interval: int
    flush_timeout: float

    @classmethod
    def build(
        cls,
        *,
        args: Any,
        probe_size: int | None,
        probe_interval: int,
        max_action_records: int,
        lld_eps: float,
        probe_seed: int,
        success_threshold: float | None,
        anchor_size: int | None,
        anchor_interval: int,
        flush_timeout: float,
    ) -> MonitorSettings:
        """Fill the automatic sizes from `args` (the GRPOConfig) and validate.

        Raises:
            ValueError: naming the argument (a negative or non-integer size or interval, a
                non-finite success threshold).
        """
        rows = rows_per_step(args)
        probe = auto_probe_size(rows) if probe_size is None else probe_size
        anchors = auto_anchor_size(rows) if anchor_size is None else anchor_size
        for name, value in (
            ("probe_size", probe),
            ("probe_interval", probe_interval),
            ("max_action_records", max_action_records),
            ("anchor_size", anchors),
            ("anchor_interval", anchor_interval),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        threshold: float | None = None
        if success_threshold is not None:
            threshold = float(success_threshold)
            if not math.isfinite(threshold):
                raise ValueError(
                    f"success_threshold must be a finite number or None, got {success_threshold!r}"
                )
        return cls(
            probe_size=probe,
            probe_interval=probe_interval,
            max_action_records=max_action_records,
            eps=float(lld_eps),
            probe_seed=int(probe_seed),
            success_threshold=threshold,
            anchor_size=anchors,
            anchor_interval=anchor_interval,
            flush_timeout=float(flush_timeout),
        )


class FromEnv:
    """Sentinel default of `lldmon_sink`: build the sink from the environment (`LLDMON_URL`, ...)."""

    def __repr__(self) -> str:
        return "<from environment>"


FROM_ENV: Final = FromEnv()


def env_configured() -> bool:
    """Whether the environment names an lldmon service (`LLDMON_URL`)."""
    return bool(os.environ.get("LLDMON_URL", "").strip())


def sink_from_env(args: Any) -> MetricSink | None:
    """`MonitorClient.from_env()` named after `args.run_name` with `args.to_dict()` as its config, or
    None when `LLDMON_URL` is not set: then the job says so on stderr (rank 0), naming a variable
    that looks like a misspelling of it. The client prints the line of a monitored job."""
    from trainer_hooks._announce import is_rank_zero, say_once, unset_note
    from trainer_hooks.client import MonitorClient

    if not env_configured():
        if is_rank_zero():
            reason = unset_note("LLDMON_URL", os.environ)
            say_once(
                ("off", reason),
                f"lldmon: monitoring off: {reason}; set it, or pass lldmon_sink=MonitorClient(...)",
            )
        return None
    run_name = getattr(args, "run_name", None)
    config: dict[str, Any] | None = None
    to_dict = getattr(args, "to_dict", None)
    if callable(to_dict):
        try:
            config = to_dict()
        except Exception:  # a config that cannot be serialised must not stop training
            config = None
    return MonitorClient.from_env(run=run_name or None, config=config)


def has_directive(sink: object) -> bool:
    """Whether `sink` offers a `directive` (duck-typed; a failing property counts as none)."""
    if sink is None:
        return False
    try:
        return getattr(sink, "directive", None) is not None
    except Exception:
        return False
