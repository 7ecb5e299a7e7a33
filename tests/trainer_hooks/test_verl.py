"""Tests of trainer_hooks.verl (the loss, the probe actor, Tracking) against the real verl package (0.9.1);
skipped where verl is absent. The probe-actor tests run real actor updates of verl's TrainingWorker
(FSDP2 engine on CPU through a minimal CPU platform, gloo, one process, a tiny model built in code).

Run: `.venv-verl/bin/python -m pytest tests/trainer_hooks/test_verl.py -q -p no:cacheprovider`
(`scripts/test-verl.sh` builds that virtualenv: verl pins transformers < 5.11, the main one has TRL).
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("LLDMON_REQUIRE_VERL"):  # scripts/test-verl.sh: a missing verl is an error
    import verl
else:
    verl = pytest.importorskip("verl")

import warnings

with warnings.catch_warnings():  # verl's engine workers warn at import (Ray state API, absent engines)
    warnings.simplefilter("ignore")
    import verl.workers.engine
    import verl.workers.engine.fsdp.transformer_impl
    import verl.workers.engine_workers

import torch
from omegaconf import OmegaConf
from torch import Tensor
from verl.trainer.ppo import core_algos
from verl.utils.metric import AggregationType, Metric, reduce_metrics
from verl.utils.py_functional import append_to_dict, rename_dict
from verl.utils.tracking import Tracking
from verl.workers.config import ActorConfig, PolicyLossConfig

import trainer_hooks.verl as tv
import trainer_hooks.verl.llds as verl_llds
import trainer_hooks.verl.measurement as verl_measurement
from contracts import metrics as M
from trainer_hooks.actions import action_ids, num_actions
from trainer_hooks.likelihood import measure_step
from trainer_hooks.regularizers import Gate, Normalize, llds_loss, ma_beta
from trainer_hooks.verl.batch import rewards_from_batch, valid_searches_from_batch
from trainer_hooks.verl.names import PROBE_METRICS, VS_SOURCE

pytestmark = pytest.mark.timeout(120)

LOGGER = "lldmon.verl"
XMB_TO_EXACT = {xmb: exact for exact, xmb in M.EXACT_TO_XMB.items()}

# ----------------------------------------------------------------------------------------------
# inputs: 6 responses of 24 tokens; mask 0 = tool feedback (gaps inside rows) or padding


MASK = torch.tensor(
    [
        [1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0],  # 3 actions
        [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # 2 actions
        [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1],  # 4 actions
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 1 action
        [1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # 2 actions
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0],  # 3 actions
    ],
    dtype=torch.bool,
)
ADV_ROWS = torch.tensor([1.2, -0.8, 0.5, -1.1, 0.0, 0.9])


def _inputs(seed: int = 0, *, drift: float = 0.3, adv_rows: Tensor = ADV_ROWS) -> dict[str, Tensor]:
    """verl's policy-loss inputs: (B, T) old/new log-probs, per-token advantages, bool mask."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(MASK.shape, generator=gen) * 3.0 - 0.05
    new = old + drift * torch.randn(MASK.shape, generator=gen)
    # garbage off the mask must never matter
    old = torch.where(MASK, old, torch.full_like(old, -1e4))
    new = torch.where(MASK, new, torch.full_like(new, 7.0))
    adv = adv_rows[:, None].expand(MASK.shape).clone() * MASK
    return {
        "old_log_prob": old,
        "log_prob": new.clone().requires_grad_(True),
        "advantages": adv,
        "response_mask": MASK.clone(),
    }


def _actor(**policy_loss: Any) -> Any:
    """A real verl ActorConfig (as the workers build it) with lldmon's policy_loss section."""
    cls = tv.policy_loss_config_class()
    return ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_micro_batch_size_per_gpu=2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        policy_loss=cls(**policy_loss),
    )


def _vanilla(inputs: Mapping[str, Tensor], config: Any) -> tuple[Tensor, dict[str, Any]]:
    fn = core_algos.get_policy_loss_fn("vanilla")
    return fn(**{k: (v.detach() if k != "log_prob" else v) for k, v in inputs.items()}, config=config)  # type: ignore[no-any-return]


@pytest.fixture
def loss_fn(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A freshly registered "lldmon" loss (fresh warn-once state); the registry is restored after."""
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "lldmon", core_algos.POLICY_LOSS_REGISTRY["vanilla"])
    fn = tv.register()
    tv.set_llds_override(None)
    yield fn
    tv.set_llds_override(None)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# ----------------------------------------------------------------------------------------------
# registration and configuration


def test_registered_loss_is_retrievable_by_name(loss_fn: Any) -> None:
    assert core_algos.get_policy_loss_fn("lldmon") is loss_fn
    other = tv.register("lldmon_test_other")
    try:
        assert core_algos.get_policy_loss_fn("lldmon_test_other") is other
    finally:
        core_algos.POLICY_LOSS_REGISTRY.pop("lldmon_test_other")


def test_config_class_is_verls_policy_loss_config_with_lldmon_keys() -> None:
    cls = tv.policy_loss_config_class()
    assert tv.LLDMonPolicyLossConfig is cls
    assert issubclass(cls, PolicyLossConfig)
    cfg = cls(llds_lambda=0.2, llds_gate="response")
    assert cfg.loss_mode == "lldmon"
    assert cfg.get("llds_lambda") == 0.2
    assert set(tv.SETTING_KEYS) <= set(cfg)
    copy = pickle.loads(pickle.dumps(_actor(llds_lambda=0.2)))  # configs travel to Ray workers
    assert type(copy.policy_loss) is cls
    assert tv.LossSettings.from_config(copy) == tv.LossSettings(llds_lambda=0.2)


def test_verl_classes_resolve_by_their_public_paths() -> None:
    """`_target_` in users' verl configs, pickling by name (configs travel to Ray workers)."""
    from hydra.utils import get_class

    cls = tv.policy_loss_config_class()
    assert get_class("trainer_hooks.verl.LLDMonPolicyLossConfig") is cls
    assert cls.__dataclass_fields__["_target_"].default == "trainer_hooks.verl.LLDMonPolicyLossConfig"
    worker = tv.training_worker_class()
    assert get_class("trainer_hooks.verl.LLDMonTrainingWorker") is worker
    assert pickle.loads(pickle.dumps(worker)) is worker
    assert pickle.loads(pickle.dumps(cls)) is cls


@pytest.mark.parametrize(
    "bad",
    [
        {"llds_gate": "sentence"},
        {"llds_normalize": "all"},
        {"llds_lambda": -0.1},
        {"llds_lambda": float("nan")},
        {"llds_answer_weight": "half"},
        {"llds_answer_weight": -1.0},
        {"lldmon_measure": "maybe"},
        {"lldmon_drift_atol": -1.0},
        {"llds_ma_schedule": "linear"},
        {"lldmon_probe_size": -1},
        {"lldmon_anchor_interval": 0},
        {"lldmon_success_threshold": float("nan")},
        {"lldmon_actor": "sometimes"},
    ],
)
def test_invalid_settings_fail_when_the_config_is_built(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        tv.policy_loss_config_class()(**bad)


def test_base_loss_must_not_be_the_loss_itself(loss_fn: Any) -> None:
    with pytest.raises(ValueError, match="lldmon_base"):
        loss_fn(**_inputs(), config=_actor(lldmon_base="lldmon"))


def test_hydra_config_path_builds_the_class_and_registers_the_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a verl 0.9.1 worker does with `actor_rollout_ref.actor` (engine_workers.py)."""
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    monkeypatch.delitem(core_algos.POLICY_LOSS_REGISTRY, "lldmon", raising=False)
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    overrides = [
        "actor_rollout_ref.actor.policy_loss._target_=trainer_hooks.verl.LLDMonPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=lldmon",
        "+actor_rollout_ref.actor.policy_loss.llds_lambda=0.2",
        "+actor_rollout_ref.actor.policy_loss.llds_answer_weight=ma",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=4",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor, ActorConfig)
    assert type(actor.policy_loss) is tv.policy_loss_config_class()
    assert tv.LossSettings.from_config(actor) == tv.LossSettings(llds_lambda=0.2, llds_answer_weight="ma")
    assert "lldmon" in core_algos.POLICY_LOSS_REGISTRY  # registered by building the config
    loss, metrics = core_algos.get_policy_loss_fn("lldmon")(**_inputs(), config=actor)
    assert metrics[M.LLDS_ACTIVE] == 1.0
    assert torch.isfinite(loss)


def test_plain_dictconfig_actor_config_works(loss_fn: Any) -> None:
    """Older verl passes the actor config as a DictConfig; lldmon's keys then sit in policy_loss."""
    config = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
            "policy_loss": {"loss_mode": "lldmon", "llds_lambda": 0.2},
        }
    )
    inputs = _inputs()
    loss, metrics = loss_fn(**inputs, config=config)
    reg, _ = llds_loss(inputs["log_prob"], inputs["old_log_prob"], MASK, inputs["advantages"])
    expected, _ = _vanilla(inputs, config)
    assert torch.equal(loss, expected + 0.2 * reg)
    assert metrics[M.LLDS_LAMBDA] == 0.2


# ----------------------------------------------------------------------------------------------
# the loss


def test_llds_off_equals_vanilla_and_metrics_equal_measure_step(loss_fn: Any) -> None:
    config = _actor()
    inputs = _inputs()
    loss, metrics = loss_fn(**inputs, config=config)
    expected, vanilla_metrics = _vanilla(inputs, config)
    assert torch.equal(loss, expected)
    for key, value in vanilla_metrics.items():
        assert metrics[key] == value
    ref = measure_step(
        old_logp=inputs["old_log_prob"],
        new_logp=inputs["log_prob"].detach(),
        mask=MASK,
        advantages=inputs["advantages"],
        clip_eps=0.2,
    ).metrics
    for name in tv.LOSS_METRICS:
        source = XMB_TO_EXACT.get(name, name)  # in-loss deltas are published as the xmb proxy
        if source in ref:
            assert metrics[tv.weight_key(name)] == 1.0, name
            assert metrics[name] == ref[source], name
        else:  # the "correct" population needs rewards, which only the probe actor passes
            assert source in (M.LOGP_CORRECT, M.DELTA_TRAJ_CORRECT, M.FRAC_TRAJ_DECREASED_CORRECT), name
            assert metrics[tv.weight_key(name)] == 0.0, name
    assert {name for name in metrics if name.startswith("lld/")} == {
        name for name in tv.LOSS_METRICS if name.startswith("lld/")
    }
    assert not set(metrics) & set(M.EXACT_TO_XMB)  # never the exact Def. 4.1 names from the loss
    assert metrics[tv.ADV_POS_MASS] / metrics[tv.ADV_NEG_MASS] == pytest.approx(ref[M.ADV_POS_NEG_MASS_RATIO])
    assert {name: metrics[name] for name in tv.LLDS_METRICS} == dict.fromkeys(tv.LLDS_METRICS, 0.0)
    loss.backward()
    assert inputs["log_prob"].grad is not None


@pytest.mark.parametrize("gate", ["action", "response", "token"])
@pytest.mark.parametrize("normalize", ["loss_tokens", "preserving_tokens"])
def test_llds_on_equals_vanilla_plus_lambda_llds(loss_fn: Any, gate: Gate, normalize: Normalize) -> None:
    config = _actor(llds_lambda=0.2, llds_gate=gate, llds_normalize=normalize)
    inputs = _inputs(seed=1)
    loss, metrics = loss_fn(**inputs, config=config)

    new = inputs["log_prob"].detach().clone().requires_grad_(True)
    ref_inputs = {**inputs, "log_prob": new}
    vanilla, _ = _vanilla(ref_inputs, config)
    reg, stats = llds_loss(
        new, inputs["old_log_prob"], MASK, inputs["advantages"], gate=gate, normalize=normalize
    )
    expected = vanilla + 0.2 * reg
    assert torch.equal(loss, expected)
    assert reg.item() > 0  # the inputs really exercise LLDS

    loss.backward()
    expected.backward()
    assert inputs["log_prob"].grad is not None and new.grad is not None
    torch.testing.assert_close(inputs["log_prob"].grad, new.grad)
    assert torch.count_nonzero(inputs["log_prob"].grad[~MASK]) == 0
    assert metrics[M.LLDS_ACTIVE] == 1.0
    assert metrics[M.LLDS_LAMBDA] == 0.2
    assert metrics[M.LLDS_LOSS] == pytest.approx(reg.item())
    assert metrics[M.LLDS_GATED_ACTION_FRAC] == pytest.approx(stats.gated_action_frac.item())


def test_llds_term_follows_verls_global_token_normalisation(loss_fn: Any) -> None:
    """With verl's global_batch_info, the term is weighted by the micro-batch's token share * dp."""
    config = _actor(llds_lambda=0.2)
    n_local = int(MASK.sum())
    config.global_batch_info.update(
        dp_size=2, batch_num_tokens=3 * n_local, global_batch_size=12, loss_scale_factor=None
    )
    inputs = _inputs(seed=2)
    loss, _ = loss_fn(**inputs, config=config)
    vanilla, _ = _vanilla(inputs, config)
    reg, _ = llds_loss(inputs["log_prob"], inputs["old_log_prob"], MASK, inputs["advantages"])
    torch.testing.assert_close(loss, vanilla + 0.2 * (n_local * 2 / (3 * n_local)) * reg)


@pytest.mark.parametrize("weight", [0.5, "ma"])
def test_answer_weight_applies_to_the_last_action(loss_fn: Any, weight: float | str) -> None:
    config = _actor(llds_lambda=0.3, llds_answer_weight=weight, llds_gate="token")
    inputs = _inputs(seed=3)
    loss, _ = loss_fn(**inputs, config=config)
    ids = action_ids(MASK)
    n_act = num_actions(ids)
    last = (ids >= 0) & (ids == (n_act - 1)[:, None])
    beta = 0.5 if weight == 0.5 else ma_beta(float((n_act - 1).double().mean()))
    assert beta == (0.5 if weight == 0.5 else 0.75)  # 9 tool calls over 6 responses: V_s = 1.5
    reg, _ = llds_loss(
        inputs["log_prob"],
        inputs["old_log_prob"],
        MASK,
        inputs["advantages"],
        gate="token",
        answer_mask=last,
        answer_weight=beta,
    )
    vanilla, _ = _vanilla(inputs, config)
    assert torch.equal(loss, vanilla + 0.3 * reg)


def test_not_drifted_micro_batch_reports_levels_but_no_deltas(loss_fn: Any) -> None:
    inputs = _inputs(drift=0.0)
    _, metrics = loss_fn(**inputs, config=_actor())
    for name in tv.LEVEL_METRICS:
        assert metrics[tv.weight_key(name)] == (0.0 if name == M.LOGP_CORRECT else 1.0), name
    for name in tv.DELTA_METRICS:
        assert metrics[tv.weight_key(name)] == 0.0, name
        assert metrics[name] == 0.0, name


def test_key_set_is_the_same_whatever_the_data(loss_fn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's dp aggregation raises if ranks report a key on different numbers of micro-batches."""
    config = _actor(llds_lambda=0.2)
    full = set(loss_fn(**_inputs(), config=config)[1])
    all_negative = _inputs(adv_rows=-ADV_ROWS.abs() - 0.1)
    _, metrics = loss_fn(**all_negative, config=config)
    assert set(metrics) == full
    assert metrics[tv.weight_key(M.LOGP_POS)] == 0.0 and metrics[M.LOGP_POS] == 0.0
    assert set(loss_fn(**_inputs(drift=0.0), config=config)[1]) == full

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(verl_measurement, "measure_step", broken)
    monkeypatch.setattr(verl_llds, "llds_loss", broken)
    assert set(loss_fn(**_inputs(), config=config)[1]) == full
    assert not any("min" in key or "max" in key for key in full - set(_vanilla(_inputs(), config)[1]))


def test_warns_once_when_old_equals_new(loss_fn: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    config = _actor(llds_lambda=0.2)
    loss_fn(**_inputs(drift=0.0), config=config)
    assert _warnings(caplog) == []  # the first update of a rollout batch is always on-policy
    for _ in range(3):
        _, metrics = loss_fn(**_inputs(drift=0.0), config=config)
        assert metrics[M.LLDS_LOSS] == 0.0  # LLDS is a no-op: the gate never opens
    (message,) = _warnings(caplog)
    assert "ppo_mini_batch_size" in message


def test_no_warning_when_a_later_mini_batch_drifts(loss_fn: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    config = _actor()
    n = int(MASK.sum())
    config.global_batch_info.update(
        dp_size=1, batch_num_tokens=2 * n, global_batch_size=12, loss_scale_factor=None
    )
    loss_fn(**_inputs(drift=0.0), config=config)  # mini-batch 1, micro-batch 1
    loss_fn(**_inputs(drift=0.0), config=config)  # mini-batch 1, micro-batch 2
    config.global_batch_info["batch_num_tokens"] = 2 * n + 1
    loss_fn(**_inputs(drift=0.3), config=config)  # mini-batch 2 has drifted: a healthy setup
    loss_fn(**_inputs(drift=0.0), config=config)
    assert _warnings(caplog) == []


def test_warns_on_the_second_mini_batch_without_drift(loss_fn: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    config = _actor()
    n = int(MASK.sum())
    config.global_batch_info.update(
        dp_size=1, batch_num_tokens=n, global_batch_size=6, loss_scale_factor=None
    )
    loss_fn(**_inputs(drift=0.0), config=config)
    loss_fn(**_inputs(drift=0.0), config=config)
    assert _warnings(caplog) == []
    config.global_batch_info["batch_num_tokens"] = n + 5  # the next rollout batch
    loss_fn(**_inputs(drift=0.0), config=config)
    assert len(_warnings(caplog)) == 1


def test_failing_measurement_does_not_break_the_loss(
    loss_fn: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("measurement exploded")

    monkeypatch.setattr(verl_measurement, "measure_step", broken)
    config = _actor(llds_lambda=0.2)
    for seed in range(2):
        inputs = _inputs(seed=seed)
        loss, metrics = loss_fn(**inputs, config=config)
        vanilla, _ = _vanilla(inputs, config)
        reg, _ = llds_loss(inputs["log_prob"], inputs["old_log_prob"], MASK, inputs["advantages"])
        assert torch.equal(loss, vanilla + 0.2 * reg)  # LLDS still on
        assert all(metrics[tv.weight_key(name)] == 0.0 for name in tv.LOSS_METRICS)
        loss.backward()
    (message,) = _warnings(caplog)
    assert "measurement exploded" in message


def test_failing_llds_falls_back_to_the_base_loss(
    loss_fn: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("llds exploded")

    monkeypatch.setattr(verl_llds, "llds_loss", broken)
    config = _actor(llds_lambda=0.2)
    inputs = _inputs()
    loss, metrics = loss_fn(**inputs, config=config)
    assert torch.equal(loss, _vanilla(inputs, config)[0])
    assert metrics[M.LLDS_ACTIVE] == 0.0
    loss_fn(**_inputs(seed=1), config=config)
    assert len(_warnings(caplog)) == 1


# ----------------------------------------------------------------------------------------------
# switching LLDS at run time


def test_process_override_wins_over_the_config(loss_fn: Any) -> None:
    inputs = _inputs(seed=4)
    on_config, off_config = _actor(llds_lambda=0.2), _actor()
    vanilla, _ = _vanilla(inputs, off_config)
    reg, _ = llds_loss(inputs["log_prob"], inputs["old_log_prob"], MASK, inputs["advantages"])

    tv.set_llds_override(False)
    assert torch.equal(loss_fn(**inputs, config=on_config)[0], vanilla)
    tv.set_llds_override(True, 0.3)
    loss, metrics = loss_fn(**inputs, config=off_config)
    assert torch.equal(loss, vanilla + 0.3 * reg) and metrics[M.LLDS_LAMBDA] == 0.3
    tv.set_llds_override(True)  # no lambda: the config's, else the paper's 0.2
    assert loss_fn(**inputs, config=off_config)[1][M.LLDS_LAMBDA] == 0.2
    tv.set_llds_override(None)
    assert loss_fn(**inputs, config=off_config)[1][M.LLDS_ACTIVE] == 0.0
    with pytest.raises(ValueError):
        tv.set_llds_override(True, -1.0)


def test_directive_file_switches_llds(loss_fn: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    path = tmp_path / "shared" / "directive.json"
    config = _actor(llds_directive_file=str(path))
    inputs = _inputs(seed=5)
    assert loss_fn(**inputs, config=config)[1][M.LLDS_ACTIVE] == 0.0  # no file: the config
    tv.write_llds_directive(path, True, 0.25)
    assert loss_fn(**inputs, config=config)[1][M.LLDS_LAMBDA] == 0.25
    tv.write_llds_directive(path, True, 0.35)
    assert loss_fn(**inputs, config=config)[1][M.LLDS_LAMBDA] == 0.35
    tv.write_llds_directive(path, False, 0.35)
    assert loss_fn(**inputs, config=config)[1][M.LLDS_ACTIVE] == 0.0
    tv.write_llds_directive(path, True, 0.2)
    assert loss_fn(**inputs, config=config)[1][M.LLDS_LAMBDA] == 0.2
    assert _warnings(caplog) == []
    path.write_text("{not json")  # a broken file keeps the last good switch, with one warning
    assert loss_fn(**inputs, config=config)[1][M.LLDS_LAMBDA] == 0.2
    assert len(_warnings(caplog)) == 1
    path.unlink()
    assert loss_fn(**inputs, config=config)[1][M.LLDS_ACTIVE] == 0.0


@pytest.mark.parametrize(
    ("directive", "expected"),
    [
        ({"version": 3, "llds": {"enabled": True, "lam": 0.2}, "reason": "decay"}, (True, 0.2)),
        ({"enabled": False, "lam": 0.3}, (False, 0.3)),
        ({"llds": {"enabled": "yes", "lam": 0.2}}, None),
        ({"llds": {"enabled": True, "lam": -1}}, None),
        ({"llds": {"enabled": True}}, None),
        (None, None),
    ],
)
def test_llds_from_directive(directive: Any, expected: tuple[bool, float] | None) -> None:
    assert tv.llds_from_directive(directive) == expected


def test_llds_from_client_directive_object() -> None:
    class LLDS:
        enabled = True
        lam = 0.3

    class Directive:
        llds = LLDS()

    assert tv.llds_from_directive(Directive()) == (True, 0.3)


# ----------------------------------------------------------------------------------------------
# streaming: the mapping, verl's own aggregation, a real Tracking


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, float]]] = []
        self.directive: Any = None

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.calls.append((step, dict(metrics)))


def test_map_verl_metrics_renames_and_passes_through() -> None:
    data = {
        "actor/entropy": 1.5,
        "actor/entropy_loss": 1.4,  # lower priority: passes through under its own name
        "actor/grad_norm": float("nan"),
        "critic/score/mean": 0.4,
        "response_length/mean": 300.0,
        "response_length/clip_ratio": 0.1,
        "actor/ppo_kl": 0.01,
        "actor/pg_clipfrac": 0.02,
        "env/number_of_valid_search": 1.3,
        "training/num_turns/mean": 4.0,
        "timing_s/gen": 12.5,
        "val-core/nq/acc/mean@1": 0.3,
        "training/epoch": 2,
        "note": "text",
        "hist": [1.0, 2.0],
        "x" * 300: 1.0,
    }
    out = tv.map_verl_metrics(data)
    assert out[M.ENTROPY_MEAN] == 1.5
    assert out["actor/entropy_loss"] == 1.4
    assert math.isnan(out[M.GRAD_NORM])
    assert out[M.REWARD_MEAN] == 0.4
    assert out[M.RESPONSE_LENGTH_MEAN] == 300.0
    assert out[M.RESPONSE_CLIP_RATIO] == 0.1
    assert out[M.KL_OLD] == 0.01
    assert out[M.CLIP_FRAC] == 0.02
    assert out[M.SEARCH_VALID_PER_TRAJ] == 1.3
    assert out[M.TURNS_MEAN] == 4.0
    assert out["timing_s/gen"] == 12.5 and out["training/epoch"] == 2.0
    assert "actor/grad_norm" not in out and "note" not in out and "hist" not in out
    assert all(len(key) <= 256 for key in out)
    assert tv.map_verl_metrics({"actor/entropy_loss": 1.4})[M.ENTROPY_MEAN] == 1.4
    assert tv.map_verl_metrics({"num_turns/mean": 3.0, "training/num_turns/mean": 9.0})[M.TURNS_MEAN] == 3.0


def test_mass_ratio_edge_cases() -> None:
    def ratio(pos: float, neg: float) -> float:
        return tv.map_verl_metrics({"actor/lldmon/adv_pos_mass": pos, "actor/lldmon/adv_neg_mass": neg})[
            M.ADV_POS_NEG_MASS_RATIO
        ]

    assert ratio(2.0, 4.0) == 0.5
    assert ratio(1.0, 0.0) == math.inf
    assert math.isnan(ratio(0.0, 0.0))


def test_metrics_survive_verls_aggregation(loss_fn: Any) -> None:
    """Two dp ranks x two mini-batches x two micro-batches through verl's own reduction code."""
    config = _actor(llds_lambda=0.2)
    mini_batches = []
    values: list[float] = []
    for mb in range(2):
        per_rank = []
        for rank in range(2):
            per_micro: dict[str, Any] = {}
            for micro in range(2):
                seed = 8 * mb + 4 * rank + 2 * micro
                adv = ADV_ROWS if micro == 0 else -ADV_ROWS.abs() - 0.1  # no A > 0 in micro 1
                _, metrics = loss_fn(**_inputs(seed=seed, adv_rows=adv), config=config)
                if metrics[tv.weight_key(M.LOGP_POS)]:
                    values.append(metrics[M.LOGP_POS])
                append_to_dict(per_micro, Metric.from_dict(metrics, aggregation=AggregationType.MEAN))
            per_rank.append(per_micro)
        gathered = {key: [r[key] for r in per_rank] for key in per_rank[0]}  # allgather_dict_into_dict
        mini_batches.append({key: Metric.aggregate_dp(val) for key, val in gathered.items()})
    merged: dict[str, Any] = {}
    for output in mini_batches:
        append_to_dict(merged, output)
    logged = reduce_metrics(rename_dict(merged, "actor/"))  # what RayPPOTrainer logs
    out = tv.map_verl_metrics(logged)
    assert len(values) == 4
    assert out[M.LOGP_POS] == pytest.approx(sum(values) / len(values))
    assert out[M.LLDS_ACTIVE] == 1.0 and out[M.LLDS_LAMBDA] == pytest.approx(0.2)
    assert M.ADV_POS_NEG_MASS_RATIO in out and "actor/pg_clipfrac" not in out and M.CLIP_FRAC in out
    assert not any(key.startswith(("lldmon/", "actor/lldmon/", "actor/lld/")) for key in out)


def test_attach_forwards_mapped_metrics_from_a_real_tracking(capsys: pytest.CaptureFixture[str]) -> None:
    tracking = Tracking(project_name="lldmon-test", experiment_name="attach", default_backend="console")
    sink = RecordingSink()
    assert tv.attach(tracking, sink) is tracking
    tracking.log(
        data={
            "actor/entropy": 0.9,
            "critic/score/mean": 0.5,
            "actor/lld/logp_pos": -0.6,
            "actor/lldmon/w/lld/logp_pos": 0.5,
            "actor/llds/active": 1.0,
            "timing_s/step": 3.0,
        },
        step=7,
    )
    assert "step:7" in capsys.readouterr().out  # verl's own console logger still ran
    ((step, metrics),) = sink.calls
    assert step == 7
    assert metrics == {
        M.ENTROPY_MEAN: 0.9,
        M.REWARD_MEAN: 0.5,
        M.LOGP_POS: pytest.approx(-1.2),
        M.LLDS_ACTIVE: 1.0,
        "timing_s/step": 3.0,
    }
    tv.attach(tracking, sink)  # attaching again does not double-send
    tracking.log(data={"a": 1.0}, step=8)
    assert len(sink.calls) == 2
    tv.detach(tracking)
    tracking.log(data={"a": 1.0}, step=9)
    assert len(sink.calls) == 2


def test_attach_survives_a_failing_sink(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)

    class Broken:
        def log(self, step: int, metrics: Mapping[str, float]) -> None:
            raise ConnectionError("service down")

    tracking = Tracking(project_name="lldmon-test", experiment_name="broken", default_backend="console")
    tv.attach(tracking, Broken())
    tracking.log(data={"a": 1.0}, step=1)
    tracking.log(data={"a": 2.0}, step=2)
    assert len(_warnings(caplog)) == 1
    assert "step:2" in capsys.readouterr().out


def test_attach_passes_directive_changes_to_the_callback(
    loss_fn: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tracking = Tracking(project_name="lldmon-test", experiment_name="directive", default_backend="console")
    sink = RecordingSink()
    seen: list[Any] = []
    path = tmp_path / "directive.json"
    writer = tv.directive_file_writer(path)

    def on_directive(directive: Any) -> None:
        seen.append(directive)
        writer(directive)

    tv.attach(tracking, sink, on_directive=on_directive)
    tracking.log(data={"a": 1.0}, step=1)  # no directive yet
    sink.directive = {"version": 1, "llds": {"enabled": True, "lam": 0.2}}
    tracking.log(data={"a": 1.0}, step=2)
    tracking.log(data={"a": 1.0}, step=3)  # unchanged: no call
    sink.directive = {"version": 2, "llds": {"enabled": True, "lam": 0.3}}
    tracking.log(data={"a": 1.0}, step=4)
    assert [tv.llds_from_directive(d) for d in seen] == [(True, 0.2), (True, 0.3)]
    assert json.loads(path.read_text())["llds"] == {"enabled": True, "lam": 0.3}
    # ... and the loss of a worker that reads that file applies it
    _, metrics = loss_fn(**_inputs(), config=_actor(llds_directive_file=str(path)))
    assert metrics[M.LLDS_LAMBDA] == 0.3


def test_attach_new_trackings_patches_instances_created_later(capsys: pytest.CaptureFixture[str]) -> None:
    sinks: list[RecordingSink] = []

    def factory() -> RecordingSink:
        sinks.append(RecordingSink())
        return sinks[-1]

    undo = tv.attach_new_trackings(factory)
    try:
        tracking = Tracking(project_name="lldmon-test", experiment_name="auto", default_backend="console")
        tracking.log(data={"actor/grad_norm": 2.0}, step=5)
    finally:
        undo()
    assert [sink.calls for sink in sinks] == [[(5, {M.GRAD_NORM: 2.0})]]
    Tracking(project_name="lldmon-test", experiment_name="after", default_backend="console").log(
        data={"a": 1.0}, step=6
    )
    assert len(sinks) == 1


# ----------------------------------------------------------------------------------------------
# regularisers act only on real displacement; what the probe actor passes to the loss


def test_llds_is_exactly_off_on_a_micro_batch_that_has_not_drifted(loss_fn: Any) -> None:
    """Recompute noise below lldmon_drift_atol must not open LLDS gates (issue 12, item 6)."""
    config = _actor(llds_lambda=0.2, llds_gate="token")
    inputs = _inputs(drift=0.0)
    noise = 1e-5 * torch.randn(MASK.shape, generator=torch.Generator().manual_seed(9))
    inputs["log_prob"] = (inputs["log_prob"].detach() + noise).requires_grad_(True)
    noisy_reg, _ = llds_loss(
        inputs["log_prob"], inputs["old_log_prob"], MASK, inputs["advantages"], gate="token"
    )
    assert noisy_reg.item() > 0  # with the recomputed old log-probs, noise alone would open gates
    loss, metrics = loss_fn(**inputs, config=config)
    vanilla, _ = _vanilla(inputs, config)
    assert torch.equal(loss, vanilla + 0.0 * noisy_reg)
    assert metrics[M.LLDS_ACTIVE] == 1.0 and metrics[M.LLDS_LOSS] == 0.0
    loss.backward()
    grad = inputs["log_prob"].grad
    probe = inputs["log_prob"].detach().clone().requires_grad_(True)
    _vanilla({**inputs, "log_prob": probe}, config)[0].backward()
    assert grad is not None and torch.equal(grad, probe.grad)  # LLDS adds no gradient


def _answer_mask() -> Tensor:
    """A final-answer span inside the last action of some rows, none in others."""
    answer = torch.zeros(MASK.shape, dtype=torch.bool)
    answer[0, 16:20] = True
    answer[2, 20:24] = True
    answer[5, 19:22] = True
    return answer


@pytest.mark.parametrize("schedule", ["paper", "code"])
def test_llds_ma_uses_the_actors_answer_span_and_valid_search_count(loss_fn: Any, schedule: str) -> None:
    config = _actor(llds_lambda=0.3, llds_answer_weight="ma", llds_gate="token", llds_ma_schedule=schedule)
    inputs = _inputs(seed=3)
    answer = _answer_mask()
    with tv.loss_extras(tv.LossExtras(answer_mask=answer, valid_searches_mean=1.5)):
        loss, _ = loss_fn(**inputs, config=config)
    beta = ma_beta(1.5, schedule)  # type: ignore[arg-type]
    assert beta == (0.75 if schedule == "paper" else 0.5)
    reg, _ = llds_loss(
        inputs["log_prob"],
        inputs["old_log_prob"],
        MASK,
        inputs["advantages"],
        gate="token",
        answer_mask=answer,
        answer_weight=beta,
    )
    last_action, _ = verl_llds.last_action_mask(MASK)
    reg_last, _ = llds_loss(
        inputs["log_prob"],
        inputs["old_log_prob"],
        MASK,
        inputs["advantages"],
        gate="token",
        answer_mask=last_action,
        answer_weight=beta,
    )
    vanilla, _ = _vanilla(inputs, config)
    assert torch.equal(loss, vanilla + 0.3 * reg)
    assert reg.item() != reg_last.item()  # the answer span, not the whole last action


def test_llds_ma_without_the_actor_falls_back_to_last_action_and_tool_calls(loss_fn: Any) -> None:
    config = _actor(llds_lambda=0.3, llds_answer_weight="ma", llds_gate="token", llds_ma_schedule="code")
    inputs = _inputs(seed=3)
    with tv.loss_extras(tv.LossExtras(answer_mask=torch.ones(2, 2, dtype=torch.bool))):  # wrong shape
        loss, _ = loss_fn(**inputs, config=config)
    last_action, n_act = verl_llds.last_action_mask(MASK)
    beta = ma_beta(float((n_act - 1).double().mean()), "code")  # V_s = 1.5 tool calls per response
    reg, _ = llds_loss(
        inputs["log_prob"],
        inputs["old_log_prob"],
        MASK,
        inputs["advantages"],
        gate="token",
        answer_mask=last_action,
        answer_weight=beta,
    )
    assert torch.equal(loss, _vanilla(inputs, config)[0] + 0.3 * reg)


def test_loss_measures_the_correct_population_and_answer_masses_with_actor_data(loss_fn: Any) -> None:
    inputs = _inputs(seed=6)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.5])
    answer = _answer_mask()
    with tv.loss_extras(tv.LossExtras(answer_mask=answer, rewards=rewards)):
        _, metrics = loss_fn(**inputs, config=_actor())
    ref = measure_step(
        old_logp=inputs["old_log_prob"],
        new_logp=inputs["log_prob"].detach(),
        mask=MASK,
        advantages=inputs["advantages"],
        rewards=rewards,
        answer_mask=answer,
        success_threshold=1.0,
        clip_eps=0.2,
    ).metrics
    assert metrics[M.LOGP_CORRECT] == ref[M.LOGP_CORRECT]
    assert metrics[M.XMB_DELTA_TRAJ_CORRECT] == ref[M.DELTA_TRAJ_CORRECT]
    assert metrics[M.XMB_FRAC_TRAJ_DECREASED_CORRECT] == ref[M.FRAC_TRAJ_DECREASED_CORRECT]
    mapped = tv.map_verl_metrics({f"actor/{k}": v for k, v in metrics.items()})
    assert mapped[M.ADV_POS_NEG_MASS_RATIO] == pytest.approx(ref[M.ADV_POS_NEG_MASS_RATIO])
    assert mapped[M.ADV_POS_NEG_MASS_RATIO_ANSWER] == pytest.approx(ref[M.ADV_POS_NEG_MASS_RATIO_ANSWER])
    assert mapped[M.XMB_DELTA_TRAJ_POS] == pytest.approx(ref[M.DELTA_TRAJ_POS])
    assert M.DELTA_TRAJ_POS not in mapped  # the loss never publishes the exact estimator


# ----------------------------------------------------------------------------------------------
# answer spans from token ids


class PieceTokenizer:
    """decode([id]) -> a fixed piece of text: tags split over several tokens, as BPE does."""

    PIECES = (
        "<",
        "ans",
        "wer",
        ">",
        "</",
        " paris",
        " x",
        "search",
        " ",
        "er>",
        "answer",
        "<answer>",
        "</answer>",
    )

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return "".join(self.PIECES[i] for i in ids)


def _naive_span(ids: list[int]) -> list[bool]:
    pieces = [PieceTokenizer.PIECES[i] for i in ids]
    text = "".join(pieces)
    start = text.rfind("<answer>")
    if start < 0:
        return [False] * len(ids)
    close = text.find("</answer>", start + len("<answer>"))
    end = len(text) if close < 0 else close + len("</answer>")
    chars = [start <= c < end for c in range(len(text))]
    out, pos = [], 0
    for piece in pieces:
        out.append(any(chars[pos : pos + len(piece)]))
        pos += len(piece)
    return out


def test_answer_span_finder_marks_the_final_answer_span() -> None:
    finder = tv.AnswerSpanFinder(PieceTokenizer())
    # "search <answer> x</answer> <answer> paris</answer>" with tags split over tokens
    ids = [7, 8, 0, 1, 2, 3, 6, 4, 10, 3, 8, 11, 5, 4, 1, 9]
    span = finder.row_span(ids)
    assert span == (11, 16)
    responses = torch.tensor([ids, [7] * 16])
    mask = finder.mask(responses, torch.tensor([16, 16]))
    assert mask[0].tolist() == _naive_span(ids) and not mask[1].any()
    assert finder.mask(responses, torch.tensor([13, 16]))[0, 11:13].all()  # unclosed: to the end


def test_answer_span_finder_matches_a_naive_character_scan() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    finder = tv.AnswerSpanFinder(PieceTokenizer())

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.integers(0, len(PieceTokenizer.PIECES) - 1), min_size=1, max_size=30))
    def check(ids: list[int]) -> None:
        mask = finder.mask(torch.tensor([ids]), torch.tensor([len(ids)]))
        assert mask[0].tolist() == _naive_span(ids)

    check()


def test_valid_searches_and_rewards_from_a_verl_batch() -> None:
    import numpy as np
    from verl import DataProto

    scores = torch.zeros(3, 4)
    scores[:, -1] = torch.tensor([1.0, 0.0, 0.5])
    proto = DataProto.from_dict(
        tensors={"token_level_scores": scores},
        non_tensors={"valid_search_stats": np.array([2, 0, 1], dtype=object)},
    )
    td = proto.to_tensordict()
    counts, key = valid_searches_from_batch(td, 3)
    assert key == "valid_search_stats" and counts is not None and counts.tolist() == [2.0, 0.0, 1.0]
    rewards = rewards_from_batch(td)
    assert rewards is not None and rewards.tolist() == [1.0, 0.0, 0.5]
    bare = DataProto.from_dict(tensors={"x": scores}).to_tensordict()
    assert valid_searches_from_batch(bare, 3) == (None, None)
    # Search-R1 / the LLDS authors' fork keep the per-row count in meta_info["valid_search_stats"]
    meta = DataProto.from_dict(tensors={"x": scores}, meta_info={"valid_search_stats": [1, 1, 4]})
    counts, key = valid_searches_from_batch(meta.to_tensordict(), 3)
    assert key == "valid_search_stats" and counts is not None and counts.tolist() == [1.0, 1.0, 4.0]


# ----------------------------------------------------------------------------------------------
# the probe actor on a real verl TrainingWorker (FSDP2 on CPU, tiny model built in code)


def _cpu_platform() -> Any:
    """verl 0.9.1 has no CPU platform (it falls back to CUDA); the minimum to run its FSDP2 engine on CPU."""
    import contextlib
    import types

    from verl.plugin.platform.platform_base import PlatformBase

    module = types.SimpleNamespace(
        **{k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("_")}
    )
    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        setattr(module, name, lambda *a, **k: 0)
    module.reset_peak_memory_stats = lambda *a, **k: None
    module.empty_cache = lambda: None
    module.manual_seed = module.manual_seed_all = torch.manual_seed
    module.mem_get_info = lambda *a, **k: (1 << 34, 1 << 35)
    module.current_device = lambda: "cpu"
    module.set_device = lambda *a: None
    module.is_available = lambda: True
    module.get_device_name = lambda *a: "CPU"
    module.get_rng_state, module.set_rng_state = torch.get_rng_state, torch.set_rng_state

    class CPUPlatform(PlatformBase):  # type: ignore[misc]
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: module)

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    return CPUPlatform()


def _tiny_model_dir(path: Path) -> Any:
    """Byte-level BPE (tags are NOT single tokens) and a 2-layer Qwen2 (hidden 32), saved to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["what is the capital of france? paris", "search the web <answer> london </answer> <search> x"]
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=fast.pad_token_id,
        eos_token_id=fast.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(str(path))
    fast.save_pretrained(str(path))
    return fast


PROBE_POLICY_LOSS = {
    "llds_lambda": 0.2,
    "llds_answer_weight": "ma",
    "lldmon_probe_size": 8,
    "lldmon_anchor_size": 3,
    "lldmon_anchor_interval": 1,
}


@pytest.fixture(scope="module")
def tiny_actor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """A real verl 0.9.1 actor `LLDMonTrainingWorker` (FSDP2, gloo, one process) with lldmon's loss."""
    import socket
    from functools import partial

    import torch.distributed as dist
    from hydra import compose, initialize_config_dir
    from verl.plugin.platform import platform_manager
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.engine_workers import TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss

    path = tmp_path_factory.mktemp("tiny-verl-model")
    tokenizer = _tiny_model_dir(path)
    previous_platform = platform_manager._current_platform
    registry = EngineRegistry._engines["language_model"]["fsdp2"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }.items():
            mp.setenv(key, value)
        mp.setattr(platform_manager, "_current_platform", _cpu_platform())
        mp.setitem(registry, "cpu", FSDPEngineWithLMHead)
        mp.setitem(core_algos.POLICY_LOSS_REGISTRY, "lldmon", core_algos.POLICY_LOSS_REGISTRY["vanilla"])
        tv.register()  # a fresh lldmon loss (the registry entry is restored afterwards)
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
        try:
            config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
            overrides = [
                f"actor_rollout_ref.model.path={path}",
                "actor_rollout_ref.actor.strategy=fsdp2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.optim.lr=0.02",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.actor.policy_loss._target_=trainer_hooks.verl.LLDMonPolicyLossConfig",
                "actor_rollout_ref.actor.policy_loss.loss_mode=lldmon",
                *(f"+actor_rollout_ref.actor.policy_loss.{k}={v}" for k, v in PROBE_POLICY_LOSS.items()),
            ]
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                cfg = compose(config_name="ppo_trainer", overrides=overrides)
            actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
            actor.model_config = HFModelConfig(
                path=str(path),
                use_remove_padding=True,
                enable_gradient_checkpointing=False,
                override_config={"attn_implementation": "sdpa"},
            )
            worker_config = TrainingWorkerConfig(
                model_type="language_model",
                model_config=actor.model_config,
                engine_config=actor.engine,
                optimizer_config=actor.optim,
                checkpoint_config=actor.checkpoint,
            )
            worker_config.engine_config.micro_batch_size_per_gpu = 2
            worker_config.engine_config.infer_micro_batch_size_per_gpu = 2
            worker_config.engine_config.use_dynamic_bsz = False
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                worker = tv.training_worker_class()(config=worker_config)
                worker.reset()
            worker.set_loss_fn(partial(ppo_loss, config=actor))
            yield worker, tokenizer
        finally:
            dist.destroy_process_group()
    assert platform_manager._current_platform is previous_platform


RESPONSES = [
    "search the web <answer> paris </answer>",
    "what is the capital <answer> london",
    "the capital of france <answer> paris </answer>",
    "search x search x search",
    "<answer> london </answer> of france",
    "france? paris <answer> paris </answer>",
    "what <answer> x </answer> <answer> paris </answer>",
    "search the web the capital of",
]
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
VALID_SEARCH = [1, 0, 2, 3, 0, 1, 1, 2]


def _tiny_batch(tokenizer: Any, *, response_len: int = 16, prompt_len: int = 6) -> Any:
    """A DataProto as verl's trainer hands it to the actor (before old log-probs), GRPO groups of 2."""
    import numpy as np
    from verl import DataProto

    b = len(RESPONSES)
    pad = tokenizer.pad_token_id
    prompts = torch.full((b, prompt_len), pad)
    prompt_mask = torch.zeros(b, prompt_len, dtype=torch.long)
    responses = torch.full((b, response_len), pad)
    response_attn = torch.zeros(b, response_len, dtype=torch.long)
    for i, text in enumerate(RESPONSES):
        p = tokenizer.encode("what is the capital?")[: prompt_len - (i % 2)]
        prompts[i, prompt_len - len(p) :] = torch.tensor(p)
        prompt_mask[i, prompt_len - len(p) :] = 1
        r = tokenizer.encode(text)[:response_len]
        responses[i, : len(r)] = torch.tensor(r)
        response_attn[i, : len(r)] = 1
    response_mask = response_attn.clone()
    response_mask[:, 3:5] = 0  # tool feedback: two actions per response
    scores = torch.zeros(b, response_len)
    last = response_attn.sum(dim=1) - 1
    scores[torch.arange(b), last] = torch.tensor(REWARDS)
    group = torch.tensor(REWARDS).view(-1, 2)
    adv = ((group - group.mean(dim=1, keepdim=True)) / (group.std(dim=1, keepdim=True) + 1e-6)).view(-1)
    attention = torch.cat([prompt_mask, response_attn], dim=1)
    proto = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "token_level_scores": scores,
            "advantages": adv[:, None] * response_mask,
        },
        non_tensors={"valid_search_stats": np.array(VALID_SEARCH, dtype=object)},
        meta_info={"temperature": 1.0},
    )
    return proto


def _score(worker: Any, proto: Any) -> Tensor:
    """(B, T) log-probs of the batch's responses under the worker's current policy (compute_log_prob)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    td = left_right_2_no_padding(proto.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    return no_padding_2_padding(tu.get(worker.infer_batch(td), "log_probs"), td).float()  # type: ignore[no-any-return]


def _update(worker: Any, proto: Any, *, mini_batch_size: int = 4) -> dict[str, Any]:
    """One training step as verl's RayPPOTrainer._update_actor does it; returns the logged actor metrics."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(proto.to_tensordict())
    tu.assign_non_tensor(
        td,
        calculate_entropy=False,
        global_batch_size=mini_batch_size,
        mini_batch_size=mini_batch_size,
        epochs=1,
        seed=1,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    output = worker.train_mini_batch(td)
    metrics = rename_dict(tu.get(output, "metrics"), "actor/")
    return reduce_metrics(metrics)  # type: ignore[no-any-return]


def test_probe_actor_reports_the_exact_post_update_delta(tiny_actor: tuple[Any, Any]) -> None:
    worker, tokenizer = tiny_actor
    proto = _tiny_batch(tokenizer)
    before = _score(worker, proto)  # the rollout policy's log-probs, as verl recomputes them
    proto.batch["old_log_probs"] = before
    logged = _update(worker, proto)  # two mini-batches: two optimizer steps
    after = _score(worker, proto)
    mask = proto.batch["response_mask"]
    assert bool(((after - before).abs() * mask).sum() > 0)  # the update really moved the policy
    naive = measure_step(
        old_logp=before,
        new_logp=after,
        mask=mask,
        advantages=proto.batch["advantages"],
        rewards=torch.tensor(REWARDS),
        success_threshold=1.0,
    ).metrics
    out = tv.map_verl_metrics(logged)
    for name in PROBE_METRICS:
        assert math.isfinite(out[name]), name
        assert out[name] == pytest.approx(naive[name], abs=1e-5), name
    # the in-loss drift is published apart, as the proxy it is
    assert M.XMB_DELTA_TRAJ_POS in out and out[M.XMB_DELTA_TRAJ_POS] != out[M.DELTA_TRAJ_POS]
    # what the actor passed to the loss reached it: rewards, answer spans, the valid-search count
    assert math.isfinite(out[M.LOGP_CORRECT])
    assert math.isfinite(out[M.ADV_POS_NEG_MASS_RATIO_ANSWER])
    assert out[VS_SOURCE] == 1.0
    assert out[M.LLDS_ACTIVE] == 1.0


def test_probe_actor_anchor_set_is_rescored_after_the_update(tiny_actor: tuple[Any, Any]) -> None:
    worker, tokenizer = tiny_actor
    worker._lldmon_anchors = None  # a fresh set
    proto = _tiny_batch(tokenizer)
    before = _score(worker, proto)
    proto.batch["old_log_probs"] = before
    out = tv.map_verl_metrics(_update(worker, proto))
    after = _score(worker, proto)
    anchors = [i for i, r in enumerate(REWARDS) if r >= 1.0][: PROBE_POLICY_LOSS["lldmon_anchor_size"]]
    mask = proto.batch["response_mask"][anchors].bool()
    assert out[M.ANCHOR_SIZE] == len(anchors)
    assert out[M.ANCHOR_LOGP] == pytest.approx(float(after[anchors][mask].mean()), abs=1e-5)
    delta = (after[anchors] - before[anchors])[mask]
    assert out[M.ANCHOR_DELTA] == pytest.approx(float(delta.mean()), abs=1e-5)
    d_traj = ((after[anchors] - before[anchors]) * mask).sum(dim=1)
    assert out[M.ANCHOR_FRAC_DECREASED] == pytest.approx(float((d_traj < 0).double().mean()))


def test_probe_actor_answer_masks_are_the_final_answer_spans(tiny_actor: tuple[Any, Any]) -> None:
    _, tokenizer = tiny_actor
    proto = _tiny_batch(tokenizer)
    finder = tv.AnswerSpanFinder(tokenizer)
    responses = proto.batch["responses"]
    lengths = proto.batch["attention_mask"][:, -responses.shape[1] :].sum(dim=1)
    mask = finder.mask(responses, lengths)
    assert mask.any(dim=1).sum() >= 4
    for i in range(len(RESPONSES)):
        text = tokenizer.decode(responses[i][: int(lengths[i])].tolist())
        marked = tokenizer.decode(responses[i][mask[i]].tolist())
        start = text.rfind("<answer>")
        if start < 0:
            assert marked == "", text
            continue
        close = text.find("</answer>", start)
        expected = text[start:] if close < 0 else text[start : close + len("</answer>")]
        assert marked.strip() == expected.strip(), (text, marked)
        assert bool(mask[i].nonzero().diff(dim=0).eq(1).all())  # one contiguous span


def test_lldmon_config_installs_the_probe_actor_in_the_worker_process() -> None:
    from verl.workers.engine_workers import ActorRolloutRefWorker

    original = ActorRolloutRefWorker.actor_worker_cls
    try:
        ActorRolloutRefWorker.actor_worker_cls = verl.workers.engine_workers.TrainingWorker
        tv.policy_loss_config_class()(lldmon_actor=False)
        assert ActorRolloutRefWorker.actor_worker_cls is verl.workers.engine_workers.TrainingWorker
        tv.policy_loss_config_class()()
        assert ActorRolloutRefWorker.actor_worker_cls is tv.training_worker_class()
        assert tv.LLDMonTrainingWorker is tv.training_worker_class()
    finally:
        ActorRolloutRefWorker.actor_worker_cls = original


def test_probe_of_a_seeded_subset_equals_naive_rescoring_of_those_rows(
    tiny_actor: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """probe_size 3 (not a multiple of the micro-batch size 2: padded, then dropped)."""
    worker, tokenizer = tiny_actor
    settings = tv.LossSettings(llds_lambda=0.2, probe_size=3, probe_seed=5, anchor_size=0)
    monkeypatch.setattr(worker, "_lldmon_settings", lambda: settings)
    from verl.workers.utils.padding import left_right_2_no_padding

    proto = _tiny_batch(tokenizer)
    worker._lldmon_step += 1  # the rows the next step will draw
    rows = worker._lldmon_probe_rows(
        left_right_2_no_padding(proto.to_tensordict()), len(RESPONSES), settings
    )[:3]
    worker._lldmon_step -= 1
    assert len(set(rows.tolist())) == 3
    signs = {float(torch.sign(proto.batch["advantages"][r].sum())) for r in rows.tolist()}
    assert {1.0, -1.0} <= signs  # drawn by advantage sign: both populations among 3 rows
    before = _score(worker, proto)
    proto.batch["old_log_probs"] = before
    out = tv.map_verl_metrics(_update(worker, proto))
    after = _score(worker, proto)
    naive = measure_step(
        old_logp=before[rows],
        new_logp=after[rows],
        mask=proto.batch["response_mask"][rows],
        advantages=proto.batch["advantages"][rows],
        rewards=torch.tensor(REWARDS)[rows],
        success_threshold=1.0,
    ).metrics
    for name in PROBE_METRICS:
        if name in naive:
            assert out[name] == pytest.approx(naive[name], abs=1e-5), name
        else:  # an empty population among the 3 rows: not published
            assert name not in out, name
    assert M.ANCHOR_LOGP not in out


def test_attach_new_trackings_gives_the_factory_verls_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink is named like verl's experiment, in verl's project, with the job's config (issue 12, item 8)."""
    seen: list[dict[str, Any]] = []

    def factory(*, project: str | None, experiment: str | None, config: Any) -> RecordingSink:
        seen.append({"project": project, "experiment": experiment, "config": config})
        return RecordingSink()

    undo = tv.attach_new_trackings(factory)
    try:
        Tracking("nq", "grpo-3b", default_backend="console", config={"trainer": {"total_epochs": 2}})
    finally:
        undo()
    assert seen == [{"project": "nq", "experiment": "grpo-3b", "config": {"trainer": {"total_epochs": 2}}}]

    # no factory: MonitorClient.from_env() under verl's names
    from trainer_hooks.client import MonitorClient

    monkeypatch.setenv("LLDMON_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("LLDMON_RUN", raising=False)
    monkeypatch.delenv("LLDMON_PROJECT", raising=False)
    monkeypatch.setenv("RANK", "1")  # a disabled client: nothing is sent from this test
    made: list[Any] = []
    original = tv.attach

    def spy(tracking: Any, sink: Any, **kwargs: Any) -> Any:
        made.append(sink)
        return original(tracking, sink, **kwargs)

    monkeypatch.setattr("trainer_hooks.verl.tracking.attach", spy)
    undo = tv.attach_new_trackings()
    try:
        Tracking(
            project_name="hotpot",
            experiment_name="exp-7",
            default_backend="console",
            config=OmegaConf.create({"actor": {"lr": 1e-6}}),
        )
    finally:
        undo()
    (client,) = made
    assert isinstance(client, MonitorClient)
    assert client.identity.run_name == "exp-7" and client.identity.project == "hotpot"
    assert client.identity.config == {"actor": {"lr": 1e-6}}
    client.close(timeout=1)
