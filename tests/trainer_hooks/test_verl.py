"""Tests of trainer_hooks.verl against the real verl package (0.9.1); skipped where verl is absent.

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

import torch
from omegaconf import OmegaConf
from torch import Tensor
from verl.trainer.ppo import core_algos
from verl.utils.metric import AggregationType, Metric, reduce_metrics
from verl.utils.py_functional import append_to_dict, rename_dict
from verl.utils.tracking import Tracking
from verl.workers.config import ActorConfig, PolicyLossConfig

import trainer_hooks.verl as tv
from contracts import metrics as M
from trainer_hooks.actions import action_ids, num_actions
from trainer_hooks.likelihood import measure_step
from trainer_hooks.regularizers import Gate, Normalize, llds_loss, ma_beta

pytestmark = pytest.mark.timeout(120)

LOGGER = "lldmon.verl"

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
        assert metrics[tv.weight_key(name)] == 1.0, name
        assert metrics[name] == ref[name], name
    assert {name for name in metrics if name.startswith("lld/")} == {
        name for name in tv.LOSS_METRICS if name.startswith("lld/")
    }
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
        assert metrics[tv.weight_key(name)] == 1.0, name
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

    monkeypatch.setattr(tv, "measure_step", broken)
    monkeypatch.setattr(tv, "llds_loss", broken)
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

    monkeypatch.setattr(tv, "measure_step", broken)
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

    monkeypatch.setattr(tv, "llds_loss", broken)
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
    assert out[M.KL] == 0.01
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
    assert json.loads(path.read_text()) == {"llds": {"enabled": True, "lam": 0.3}}
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
