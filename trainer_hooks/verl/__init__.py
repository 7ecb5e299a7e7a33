"""verl integration (0.9.1): lldmon's measurement and LLDS as a verl policy loss, an actor with the
exact post-update probe, and verl's per-step scalars streamed to the lldmon service.

    actor_rollout_ref.actor.policy_loss._target_=trainer_hooks.verl.LLDMonPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=lldmon
    +actor_rollout_ref.actor.policy_loss.llds_lambda=0.2          # optional: LLDS on (0 = off)

and, in the process that owns verl's trainer, `attach(trainer.logger, client)`, or
`attach_new_trackings()` from a module named in `VERL_USE_EXTERNAL_MODULES` (with `LLDMON_URL` set:
a `MonitorClient.from_env()` named after verl's experiment, in verl's project, with the job's config).

- `LLDMonPolicyLossConfig`: verl's `PolicyLossConfig` with lldmon's keys (`SETTING_KEYS`); building
  it registers the "lldmon" loss (`register`) and installs the probe actor (`install`) in the
  worker process. Both classes it needs verl for (`LLDMonPolicyLossConfig`, `LLDMonTrainingWorker`)
  are created on first access; importing this package never imports verl.
- `attach` / `attach_new_trackings` / `detach`: verl's `Tracking.log` also feeds a sink, under
  canonical names (`map_verl_metrics`).
- `set_llds_override`, `directive_file_writer`, ...: switching LLDS while verl runs;
  `DirectiveLevers`: the service's checkpoint/stop/rollback requests in verl's driver loop (a rollback
  restarts the job under `lldmon supervise`: `trainer_hooks.verl.rollback`).

One module per concept: `loss` (the registered policy loss), `measurement` (its in-loss
measurement), `llds` (its LLDS term), `extras` (what the actor passes to the loss), `actor` (the
probe actor), `batch` (what the actor reads from verl's batch), `config` (settings and verl's config
class), `directive` (switching LLDS at run time, the levers), `rollback` (rollback by restart),
`tracking` (streaming verl's scalars), `names` (metric names, verl keys -> canonical names). Design
notes: docs/hooks-verl.md.
"""

from typing import Any

from trainer_hooks._sink import MetricSink, ScalarSink
from trainer_hooks.verl.actor import install, training_worker_class
from trainer_hooks.verl.batch import AnswerSpanFinder
from trainer_hooks.verl.config import LOSS_NAME, SETTING_KEYS, LossSettings, policy_loss_config_class
from trainer_hooks.verl.directive import (
    DirectiveLevers,
    directive_file_writer,
    get_llds_override,
    llds_from_directive,
    set_llds_override,
    write_directive,
    write_llds_directive,
)
from trainer_hooks.verl.loss import register
from trainer_hooks.verl.loss_extras import LossExtras, current_loss_extras, loss_extras
from trainer_hooks.verl.names import (
    ADV_NEG_MASS,
    ADV_NEG_MASS_ANSWER,
    ADV_POS_MASS,
    ADV_POS_MASS_ANSWER,
    DELTA_METRICS,
    LEVEL_METRICS,
    LLDS_METRICS,
    LOSS_METRICS,
    VERL_TO_CANONICAL,
    XMB_METRICS,
    map_verl_metrics,
    weight_key,
)
from trainer_hooks.verl.tracking import attach, attach_new_trackings, detach

__all__ = [
    "ADV_NEG_MASS",
    "ADV_NEG_MASS_ANSWER",
    "ADV_POS_MASS",
    "ADV_POS_MASS_ANSWER",
    "DELTA_METRICS",
    "LEVEL_METRICS",
    "LLDS_METRICS",
    "LOSS_METRICS",
    "LOSS_NAME",
    "SETTING_KEYS",
    "VERL_TO_CANONICAL",
    "XMB_METRICS",
    "AnswerSpanFinder",
    "DirectiveLevers",
    "LossExtras",
    "LossSettings",
    "MetricSink",
    "ScalarSink",
    "attach",
    "attach_new_trackings",
    "current_loss_extras",
    "detach",
    "directive_file_writer",
    "get_llds_override",
    "install",
    "llds_from_directive",
    "loss_extras",
    "map_verl_metrics",
    "policy_loss_config_class",
    "register",
    "set_llds_override",
    "training_worker_class",
    "weight_key",
    "write_directive",
    "write_llds_directive",
]

_LAZY_CLASSES = {
    "LLDMonPolicyLossConfig": policy_loss_config_class,
    "LLDMonTrainingWorker": training_worker_class,
}
"""Classes that subclass verl's: built on first access (they import verl), so not in `__all__`."""


def __getattr__(name: str) -> Any:
    factory = _LAZY_CLASSES.get(name)
    if factory is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return factory()
