"""One contract for trainer keys: the live adapters and the importers map the same raw keys to the same
canonical metrics (`contracts.trainer_keys`), so an imported log reads like the streamed run."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import metrics as M
from contracts.trainer_keys import (
    TRACKER,
    TRL,
    TRL_TO_CANONICAL,
    VERL,
    Family,
    canonical_verl,
    weight_key,
)
from monitor.detector import NONFINITE_LOSS, DetectorConfig, detect_offline
from monitor.importers import (
    ParsedLog,
    load_trl_state,
    load_trl_stdout,
    load_verl_console,
    load_verl_jsonl,
    load_wandb_csv,
)

pytest.importorskip("trl")
from trainer_hooks.trl import map_trl_logs
from trainer_hooks.verl import map_verl_metrics

NAN, INF = math.nan, math.inf
TRL_KL = next(key for key, name in TRL_TO_CANONICAL.items() if name == M.KL_REF)
"""TRL's key of the KL to the reference model."""

# --- raw trainer dicts, one per step ---------------------------------------------------------------------

TRL_LOGS: dict[int, dict[str, float]] = {
    1: {
        "loss": 0.13,
        "grad_norm": 1.49,
        "learning_rate": 1e-6,
        "reward": 1.06,
        "reward_std": 0.4,
        "frac_reward_zero_std": 0.25,
        "completions/mean_length": 312.5,
        "completions/clipped_ratio": 0.0,
        "entropy": 0.61,
        TRL_KL: 0.002,
        "clip_ratio/region_mean": 0.01,
        "tools/call_frequency": 2.0,
        "tools/failure_frequency": 0.25,
        "rewards/accuracy/mean": 0.5,
        "epoch": 0.01,
    },
    2: {
        "loss": NAN,  # a collapse signal: kept
        "grad_norm": INF,
        "reward": 0.9,
        "entropy": 0.7,
        TRL_KL: 0.004,
        "cispo_clip_ratio": 0.03,
        "tools/call_frequency": 1.0,
        "tools/failure_frequency": 0.0,
        "epoch": 0.02,
    },
    3: {"loss": 0.1, "reward": 1.1, TRL_KL: 0.003, "tools/call_frequency": 3.0, "epoch": 0.03},
}

VERL_DATA: dict[int, dict[str, float]] = {
    10: {
        "actor/loss": 0.21,
        "actor/pg_loss": 0.2,
        "actor/entropy": 1.5,
        "actor/entropy_loss": 1.4,  # verl >= 0.5 logs both: the in-loss one keeps its own name
        "actor/grad_norm": 0.8,
        "actor/kl_loss": 0.01,
        "actor/ppo_kl": 0.0005,
        "actor/pg_clipfrac": 0.02,
        "critic/score/mean": 0.4,
        "response_length/mean": 300.0,
        "response_length/clip_ratio": 0.1,
        "env/number_of_valid_search": 1.3,
        "num_turns/mean": 3.0,
        "training/num_turns/mean": 9.0,  # the older location loses against num_turns/mean
        "timing_s/gen": 12.5,
        # lldmon's verl loss, averaged over micro-batches by verl, under verl's "actor/" prefix
        "actor/lld/logp_pos": -0.3,
        "actor/" + weight_key("lld/logp_pos"): 1.0,
        "actor/lld/xmb/delta_traj_pos": 0.02,  # defined on half of the micro-batches: 0.02 / 0.5
        "actor/" + weight_key("lld/xmb/delta_traj_pos"): 0.5,
        "actor/lld/logp_correct": 0.0,  # defined nowhere: absent
        "actor/" + weight_key("lld/logp_correct"): 0.0,
        "actor/lldmon/adv_pos_mass": 2.0,
        "actor/lldmon/adv_neg_mass": 4.0,
        "actor/lldmon/adv_pos_mass_answer": 1.0,
        "actor/lldmon/adv_neg_mass_answer": 0.0,
        "actor/llds/active": 1.0,
        "actor/llds/lambda": 0.2,
    },
    11: {
        "actor/loss": NAN,
        "actor/entropy_loss": 1.2,  # older verl: the only entropy
        "actor/grad_norm": INF,
        "actor/ppo_kl": 0.3,
        "critic/score/mean": 0.0,
        "training/num_turns/mean": 4.0,
        "actor/lld/xmb/delta_traj_pos": NAN,
        "actor/" + weight_key("lld/xmb/delta_traj_pos"): 0.25,
        "actor/lldmon/adv_pos_mass": 0.0,
        "actor/lldmon/adv_neg_mass": 0.0,
    },
}

EXPECTED_VERL_10 = {
    M.LOSS: 0.21,
    M.ENTROPY_MEAN: 1.5,
    M.GRAD_NORM: 0.8,
    M.KL_REF: 0.01,
    M.KL_OLD: 0.0005,
    M.CLIP_FRAC: 0.02,
    M.REWARD_MEAN: 0.4,
    M.RESPONSE_LENGTH_MEAN: 300.0,
    M.RESPONSE_CLIP_RATIO: 0.1,
    M.SEARCH_VALID_PER_TRAJ: 1.3,
    M.TURNS_MEAN: 3.0,
    M.LOGP_POS: -0.3,
    M.XMB_DELTA_TRAJ_POS: 0.04,
    M.ADV_POS_NEG_MASS_RATIO: 0.5,
    M.ADV_POS_NEG_MASS_RATIO_ANSWER: INF,
    M.LLDS_ACTIVE: 1.0,
    M.LLDS_LAMBDA: 0.2,
    "actor/pg_loss": 0.2,
    "actor/entropy_loss": 1.4,
    "training/num_turns/mean": 9.0,
    "timing_s/gen": 12.5,
}


def same(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """Equal dicts, NaN equal to NaN, floats to 1e-12 (text round trips)."""
    if a.keys() != b.keys():
        return False
    return all(
        (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] or math.isclose(a[k], b[k], rel_tol=1e-12)
        for k in a
    )


def rows(log: ParsedLog) -> dict[int, dict[str, float]]:
    """step -> {canonical name: value} of what the importer found logged."""
    out: dict[int, dict[str, float]] = {}
    for i, step in enumerate(log.steps.tolist()):
        out[step] = {name: float(log.values[name][i]) for name in log.values if log.present[name][i]}
    return out


def assert_same_rows(imported: dict[int, dict[str, float]], streamed: dict[int, dict[str, float]]) -> None:
    assert imported.keys() == streamed.keys()
    for step in streamed:
        assert same(imported[step], streamed[step]), (step, imported[step], streamed[step])


# --- the adapters ----------------------------------------------------------------------------------------


def test_live_adapters_map_the_contract() -> None:
    trl = map_trl_logs(TRL_LOGS[1])
    assert trl[M.KL_REF] == 0.002 and TRL_KL not in trl and M.KL_OLD not in trl
    assert trl[M.LOSS] == 0.13 and trl[M.REWARD_MEAN] == 1.06 and trl[M.CLIP_FRAC] == 0.01
    assert trl[M.SEARCH_VALID_PER_TRAJ] == 2.0 * (1 - 0.25)
    assert trl["tools/call_frequency"] == 2.0 and trl["learning_rate"] == 1e-6
    step2 = map_trl_logs(TRL_LOGS[2])
    assert math.isnan(step2[M.LOSS]) and step2[M.GRAD_NORM] == INF and step2[M.CLIP_FRAC] == 0.03
    assert M.SEARCH_VALID_PER_TRAJ not in map_trl_logs(TRL_LOGS[3])  # no failure frequency logged

    assert same(map_verl_metrics(VERL_DATA[10]), EXPECTED_VERL_10)
    step11 = map_verl_metrics(VERL_DATA[11])
    assert math.isnan(step11[M.LOSS]) and step11[M.ENTROPY_MEAN] == 1.2 and step11[M.TURNS_MEAN] == 4.0
    assert step11[M.KL_OLD] == 0.3 and M.KL_REF not in step11
    assert math.isnan(step11[M.XMB_DELTA_TRAJ_POS]) and math.isnan(step11[M.ADV_POS_NEG_MASS_RATIO])
    assert not [k for k in step11 if k.startswith(("actor/lld", "lldmon/", "actor/lldmon/"))]


def test_verl_reassembly_is_generic_and_unprefixed_keys_win() -> None:
    data = {
        "lld/some_future_metric": 0.375,
        weight_key("lld/some_future_metric"): 0.75,
        "actor/lld/anchor/logp": -0.5,  # not from the loss: no weight, only unprefixed
        "llds/loss": 1.0,
        "actor/llds/loss": 2.0,  # the unprefixed key wins
        "adv/x": 6.0,
        "actor/lldmon/w/adv/x": 2.0,
    }
    assert canonical_verl(data) == {
        "lld/some_future_metric": 0.5,
        M.ANCHOR_LOGP: -0.5,
        M.LLDS_LOSS: 1.0,
        "adv/x": 3.0,
    }
    assert canonical_verl({"actor/lldmon/adv_pos_mass": 1.0}) == {}  # half a pair: nothing


# --- adapters == importers -------------------------------------------------------------------------------


def _trl_streamed() -> dict[int, dict[str, float]]:
    return {step: map_trl_logs(logs) for step, logs in TRL_LOGS.items()}


def test_trl_state_import_equals_the_live_adapter(tmp_path: Path) -> None:
    history = [{**logs, "step": step} for step, logs in TRL_LOGS.items()]
    history.append({"train_runtime": 10.0, "train_loss": 0.1, "step": 3})  # the summary is skipped
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 3, "log_history": history}, indent=2))  # NaN, Infinity tokens
    assert_same_rows(rows(load_trl_state(path, strict=True)), _trl_streamed())


def test_trl_stdout_import_equals_the_live_adapter(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    lines = [f"\r 10%|#         | {step}/30 [00:01<00:10]{logs!r}\n" for step, logs in TRL_LOGS.items()]
    path.write_text("".join(lines))
    assert_same_rows(rows(load_trl_stdout(path, first_step=1, strict=True)), _trl_streamed())


def test_wandb_csv_of_a_trl_run_gives_the_same_canonical_metrics(tmp_path: Path) -> None:
    keys = sorted({k for logs in TRL_LOGS.values() for k in logs})
    path = tmp_path / "history.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["_step", "train/global_step", *(f"train/{k}" for k in keys)])
        for i, (step, logs) in enumerate(TRL_LOGS.items()):
            writer.writerow([i, step, *(repr(logs[k]) if k in logs else "" for k in keys)])
    imported = rows(load_wandb_csv(path, strict=True))
    # transformers' callback logs TRL's keys under train/: canonical names are TRL's, the rest keeps train/
    expected = {
        step: {k if k in M.CANONICAL_METRICS else f"train/{k}": v for k, v in streamed.items()}
        for step, streamed in _trl_streamed().items()
    }
    assert_same_rows(imported, expected)


def _orjson_like(value: float) -> float | None:
    return value if math.isfinite(value) else None  # verl's FileLogger writes NaN and inf as null


def test_verl_jsonl_import_equals_the_live_adapter(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as handle:
        for step, data in VERL_DATA.items():
            handle.write(
                json.dumps({"step": step, "data": {k: _orjson_like(v) for k, v in data.items()}}) + "\n"
            )
    imported = rows(load_verl_jsonl(path, strict=True))
    # orjson's null reads back as NaN: an inf the adapter saw is NaN in the file, the rest is identical
    streamed = {
        step: map_verl_metrics({k: v if math.isfinite(v) else NAN for k, v in data.items()})
        for step, data in VERL_DATA.items()
    }
    assert_same_rows(imported, streamed)
    assert same(imported[10], EXPECTED_VERL_10)
    assert math.isnan(imported[11][M.LOSS]) and imported[11][M.TURNS_MEAN] == 4.0


def test_verl_console_import_equals_the_live_adapter(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    ray = "\x1b[36m(TaskRunner pid=7283)\x1b[0m "
    lines = [
        ray + f"step:{step} - " + " - ".join(f"{k}:{v}" for k, v in data.items())
        for step, data in VERL_DATA.items()
    ]
    path.write_text("config dump: {...}\n" + "\n".join(lines) + "\n")
    streamed = {step: map_verl_metrics(data) for step, data in VERL_DATA.items()}
    assert_same_rows(rows(load_verl_console(path, strict=True)), streamed)


def test_verl_console_merges_a_step_before_mapping(tmp_path: Path) -> None:
    """A step printed on two lines is one dict: the weight on one line, the value on the other."""
    data = VERL_DATA[10]
    keys = list(data)
    half = len(keys) // 2
    path = tmp_path / "train.log"
    path.write_text(
        "\n".join(
            "step:10 - " + " - ".join(f"{k}:{data[k]}" for k in part) for part in (keys[:half], keys[half:])
        )
    )
    assert_same_rows(rows(load_verl_console(path, strict=True)), {10: map_verl_metrics(data)})


# --- the detector on an imported verl log ----------------------------------------------------------------


def test_nonfinite_loss_fires_on_an_imported_verl_log(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as handle:
        for step in range(80):
            data: dict[str, Any] = {
                "actor/loss": None if step == 50 else float(rng.normal(0, 0.02)),  # orjson: NaN -> null
                "actor/grad_norm": float(np.exp(rng.normal(0, 0.1))),
                "critic/score/mean": 0.2 + 0.4 * (1 - math.exp(-step / 40)),
                "actor/entropy": 0.5,
                "response_length/mean": 300.0,
            }
            handle.write(json.dumps({"step": step, "data": data}) + "\n")
    log = load_verl_jsonl(path)
    assert "actor/loss" not in log.values and M.LOSS in log.values
    result = detect_offline(log.steps, log.values, DetectorConfig(), log.present)
    finding = next(f for f in result.findings if f.kind == NONFINITE_LOSS)
    assert finding.first_step == 50 and finding.evidence["metric"] == M.LOSS


# --- row_keys: what the importers map column-wise maps to itself -----------------------------------------

KEY_POOL = sorted(
    {
        *(k for logs in TRL_LOGS.values() for k in logs),
        *(k for data in VERL_DATA.values() for k in data),
        *(f"train/{k}" for logs in TRL_LOGS.values() for k in logs),
        "lld/logp_pos",
        "llds/active",
        M.LOSS,
        M.ENTROPY_MEAN,
        M.ADV_POS_NEG_MASS_RATIO,
        "lld/xmb/delta_traj_pos",
        weight_key("lld/xmb/delta_traj_pos"),
        "foo",
        "actor/foo",
        weight_key("foo"),
        "train/foo",
        "actor/train/foo",
        "timing/gen",
    }
)


@pytest.mark.parametrize("family", [TRL, VERL, TRACKER], ids=lambda f: f.name)
@settings(max_examples=150, deadline=None)
@given(
    row=st.dictionaries(
        st.sampled_from(KEY_POOL),
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 0.5])),
        max_size=25,
    )
)
def test_keys_outside_row_keys_map_to_themselves(family: Family, row: dict[str, float]) -> None:
    special = family.row_keys(row)
    plain = {k: v for k, v in row.items() if k not in special}
    together = family.canonical({k: v for k, v in row.items() if k in special})
    assert not plain.keys() & together.keys()
    assert same(family.canonical(row), {**together, **plain})
