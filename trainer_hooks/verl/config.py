"""lldmon's keys under verl's `actor.policy_loss`: `LossSettings` (validated, coerced from verl's
config objects) and `LLDMonPolicyLossConfig`, verl's `PolicyLossConfig` with those keys (the class a
verl config names in `_target_`). Keys and defaults: docs/hooks-verl.md."""

from __future__ import annotations

import logging
import math
import numbers
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from contracts import metrics as M
from trainer_hooks.regularizers import Gate, MASchedule, Normalize

__all__ = [
    "LOSS_NAME",
    "SETTING_KEYS",
    "AnswerWeight",
    "LossSettings",
    "config_value",
    "policy_loss_config_class",
]

logger = logging.getLogger("lldmon.verl")

LOSS_NAME: Final = "lldmon"
"""Default name of the registered policy loss (`policy_loss.loss_mode`)."""

_PACKAGE: Final = __name__.rpartition(".")[0]
_CONFIG_CLASS_PATH: Final = f"{_PACKAGE}.LLDMonPolicyLossConfig"

AnswerWeight = float | Literal["ma"]

SETTING_KEYS: Final[Mapping[str, str]] = {
    "lldmon_base": "base",
    "lldmon_measure": "measure",
    "lldmon_actor": "actor",
    "lldmon_eps": "eps",
    "lldmon_drift_atol": "drift_atol",
    "llds_lambda": "llds_lambda",
    "llds_gate": "llds_gate",
    "llds_answer_weight": "llds_answer_weight",
    "llds_normalize": "llds_normalize",
    "llds_ma_schedule": "llds_ma_schedule",
    "llds_directive_file": "llds_directive_file",
    "lldmon_success_threshold": "success_threshold",
    "lldmon_probe_size": "probe_size",
    "lldmon_probe_seed": "probe_seed",
    "lldmon_anchor_size": "anchor_size",
    "lldmon_anchor_interval": "anchor_interval",
}
"""Config key under `actor.policy_loss` -> `LossSettings` field."""

_INT_FIELDS: Final = ("probe_size", "probe_seed", "anchor_size", "anchor_interval")


@dataclass(frozen=True)
class LossSettings:
    """lldmon's settings of the policy loss, read from `config.policy_loss` (see `SETTING_KEYS`)."""

    base: str = "vanilla"
    measure: bool = True
    actor: bool = True
    eps: float = 0.0
    drift_atol: float = 1e-3
    llds_lambda: float = 0.0
    llds_gate: Gate = "action"
    llds_answer_weight: AnswerWeight = 1.0
    llds_normalize: Normalize = "loss_tokens"
    llds_ma_schedule: MASchedule = "paper"
    llds_directive_file: str | None = None
    success_threshold: float = M.DEFAULT_SUCCESS_THRESHOLD
    probe_size: int = 8
    probe_seed: int = 0
    anchor_size: int = M.DEFAULT_ANCHOR_SIZE
    anchor_interval: int = M.DEFAULT_ANCHOR_INTERVAL

    def __post_init__(self) -> None:
        if not isinstance(self.base, str) or not self.base:
            raise ValueError(f"lldmon_base must be a registered policy loss name, got {self.base!r}")
        for key, value in (
            ("lldmon_eps", self.eps),
            ("lldmon_drift_atol", self.drift_atol),
            ("llds_lambda", self.llds_lambda),
            ("lldmon_success_threshold", self.success_threshold),
        ):
            if not math.isfinite(value):
                raise ValueError(f"{key} must be finite, got {value!r}")
        if self.drift_atol < 0 or self.llds_lambda < 0:
            raise ValueError("lldmon_drift_atol and llds_lambda must be >= 0")
        if self.llds_gate not in get_args(Gate):
            raise ValueError(f"llds_gate must be one of {get_args(Gate)}, got {self.llds_gate!r}")
        if self.llds_normalize not in get_args(Normalize):
            raise ValueError(
                f"llds_normalize must be one of {get_args(Normalize)}, got {self.llds_normalize!r}"
            )
        if self.llds_ma_schedule not in get_args(MASchedule):
            raise ValueError(
                f"llds_ma_schedule must be one of {get_args(MASchedule)}, got {self.llds_ma_schedule!r}"
            )
        w = self.llds_answer_weight
        if w != "ma" and (isinstance(w, str) or not math.isfinite(w) or w < 0):
            raise ValueError(f'llds_answer_weight must be a finite number >= 0 or "ma", got {w!r}')
        for key, n, low in (
            ("lldmon_probe_size", self.probe_size, 0),
            ("lldmon_probe_seed", self.probe_seed, 0),
            ("lldmon_anchor_size", self.anchor_size, 0),
            ("lldmon_anchor_interval", self.anchor_interval, 1),
        ):
            if isinstance(n, bool) or not isinstance(n, int) or n < low:
                raise ValueError(f"{key} must be an integer >= {low}, got {n!r}")

    @classmethod
    def from_config(cls, config: Any) -> LossSettings:
        """Settings from an actor config (`ActorConfig`, DictConfig or mapping) or its
        `policy_loss` section; missing keys and null values take the defaults.

        Raises:
            ValueError: a value of the wrong type or out of range (the message names the key).
        """
        section = config_value(config, "policy_loss", None)
        if section is None:
            section = config
        values: dict[str, Any] = {}
        for key, field_name in SETTING_KEYS.items():
            value = config_value(section, key, None)
            if value is None:
                continue
            try:
                values[field_name] = _coerce(field_name, value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"policy_loss.{key}: {exc}") from exc
        return cls(**values)


def _coerce(field_name: str, value: Any) -> Any:
    if field_name in ("measure", "actor"):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TypeError(f"expected a bool, got {value!r}")
    if field_name in ("eps", "drift_atol", "llds_lambda", "success_threshold"):
        if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if field_name in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral | str):
            raise TypeError(f"expected an integer, got {value!r}")
        return int(value)
    if field_name == "llds_answer_weight":
        if isinstance(value, str) and value.strip().lower() == "ma":
            return "ma"
        if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
            raise TypeError(f'expected a number or "ma", got {value!r}')
        return float(value)
    if field_name == "llds_directive_file":
        return os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def config_value(obj: Any, key: str, default: Any) -> Any:
    """`obj[key]` for verl's BaseConfig, OmegaConf DictConfig, dicts or plain objects."""
    if obj is None:
        return default
    getter = getattr(obj, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:
            return default
    return getattr(obj, key, default)


# ----------------------------------------------------------------------------------------------
# verl's PolicyLossConfig with lldmon's keys (built lazily: verl is optional)

_config_class: type | None = None
_config_class_lock = threading.Lock()


def policy_loss_config_class() -> type:
    """`LLDMonPolicyLossConfig`: verl's `PolicyLossConfig` plus the keys in `SETTING_KEYS`.

    Created on first use (it subclasses a verl class) and reachable as
    `trainer_hooks.verl.LLDMonPolicyLossConfig`, the `_target_` verl's config loader instantiates.
    Building an instance validates lldmon's keys and registers the "lldmon" loss in this process
    if it is not registered yet.
    """
    global _config_class
    with _config_class_lock:
        if _config_class is not None:
            return _config_class
        from dataclasses import dataclass as verl_dataclass

        from verl.trainer.ppo import core_algos
        from verl.workers.config import PolicyLossConfig

        @verl_dataclass
        class LLDMonPolicyLossConfig(PolicyLossConfig):  # type: ignore[misc]
            """verl's PolicyLossConfig with lldmon's keys (`trainer_hooks.verl.SETTING_KEYS`)."""

            _target_: str = _CONFIG_CLASS_PATH
            loss_mode: str = LOSS_NAME
            lldmon_base: str = "vanilla"
            lldmon_measure: bool = True
            lldmon_actor: bool = True
            lldmon_eps: float = 0.0
            lldmon_drift_atol: float = 1e-3
            llds_lambda: float = 0.0
            llds_gate: str = "action"
            llds_answer_weight: Any = 1.0
            llds_normalize: str = "loss_tokens"
            llds_ma_schedule: str = "paper"
            llds_directive_file: Any = None
            lldmon_success_threshold: float = M.DEFAULT_SUCCESS_THRESHOLD
            lldmon_probe_size: int = 8
            lldmon_probe_seed: int = 0
            lldmon_anchor_size: int = M.DEFAULT_ANCHOR_SIZE
            lldmon_anchor_interval: int = M.DEFAULT_ANCHOR_INTERVAL

            def __post_init__(self) -> None:
                parent = getattr(super(), "__post_init__", None)
                if callable(parent):
                    parent()
                settings = LossSettings.from_config(self)  # validates, raises ValueError
                if self.loss_mode == LOSS_NAME and LOSS_NAME not in core_algos.POLICY_LOSS_REGISTRY:
                    from trainer_hooks.verl.loss import register

                    register(LOSS_NAME)
                if settings.actor:
                    _install_actor()

        # Importable and picklable by name, through the package's module __getattr__.
        LLDMonPolicyLossConfig.__module__ = _PACKAGE
        LLDMonPolicyLossConfig.__qualname__ = "LLDMonPolicyLossConfig"
        _config_class = LLDMonPolicyLossConfig
        return LLDMonPolicyLossConfig


def _install_actor() -> None:
    """The probe actor (`trainer_hooks.verl.actor.install`) in this process; a failure is logged."""
    try:
        from trainer_hooks.verl.actor import install

        install()
    except Exception as exc:
        logger.warning("lldmon: could not install the probe actor (no lld/delta_* metrics): %r", exc)
