"""TRL integration: lldmon's measurement (and LLDS/SAPO) inside TRL's `GRPOTrainer`.

    from trainer_hooks.trl import MonitoredGRPOTrainer      # LLDMON_URL=http://lldmon:8000
    trainer = MonitoredGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)
    trainer.train()

- `MonitoredGRPOTrainer`: measures likelihood displacement at every optimizer step (exact post-update
  probe, cross-mini-batch drift, levels, anchor set) and streams it with TRL's own scalars; optionally
  adds the LLDS / SAPO term (static, or switched by the service's directive).
- `LLDMonitorCallback(sink)`: TRL's logged scalars under canonical names, for any Trainer.

One module per concept: `trainer` (the subclass), `measurement` (measurement driver), `regularizer`
(LLDS/SAPO driver), `callback`, `config` (options, auto sizes, sink from the environment), `names`
(TRL keys -> canonical names), `measure` (pure per-step bookkeeping), `llds` (pure LLDS settings,
answer spans, directive, scaling). Design notes: docs/hooks-trl.md.
"""

from trainer_hooks._sink import MetricSink
from trainer_hooks.trl.callback import LLDMonitorCallback
from trainer_hooks.trl.config import auto_anchor_size, auto_probe_size
from trainer_hooks.trl.names import TRL_TO_CANONICAL, map_trl_logs
from trainer_hooks.trl.trainer import MonitoredGRPOTrainer

__all__ = [
    "TRL_TO_CANONICAL",
    "LLDMonitorCallback",
    "MetricSink",
    "MonitoredGRPOTrainer",
    "auto_anchor_size",
    "auto_probe_size",
    "map_trl_logs",
]
