"""The lab's statistics per arm: the Wilson interval, Fisher's exact p and the t interval against values
worked by hand, steps wasted (with and without rollbacks), which arms are compared, the summary's table,
and the `heal` mode of the grid."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from contracts.wire import DIRECTIVE_POLICIES
from lldmon_lab.lab.grid import POLICIES, PRESETS, GridError, Setting, expand, resolve_grid
from lldmon_lab.lab.results import (
    STATISTICS_TEXT,
    analyse,
    compare_arms,
    group_stats,
    render_markdown,
    summary_payload,
)
from lldmon_lab.lab.stats import fisher_p, mean_interval, rate_interval
from tests.test_boundaries import imported_roots

ROOT = Path(__file__).resolve().parents[1]
Z95 = 1.959963984540054
T95_DF4 = 2.7764451051977987  # Student t, 97.5th percentile, 4 degrees of freedom (printed tables: 2.776)

# ----------------------------------------------------------------------------------------------
# the statistics


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score interval, written out (the oracle)."""
    p, z2 = k / n, Z95**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_less_by_hand(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """P(arm a has <= k_a of the k_a + k_b collapses) under the hypergeometric null."""
    total, k = n_a + n_b, k_a + k_b
    return sum(math.comb(n_a, i) * math.comb(n_b, k - i) for i in range(k_a + 1)) / math.comb(total, k)


def test_wilson_interval() -> None:
    ci = rate_interval(0, 20)
    assert ci is not None
    low, high = ci
    assert (
        low == 0.0
        and high == pytest.approx(Z95**2 / (20 + Z95**2))
        and high == pytest.approx(0.1611, abs=1e-4)
    )
    for k, n in [(2, 5), (3, 10), (10, 10), (7, 20)]:
        assert rate_interval(k, n) == pytest.approx(wilson(k, n)), (k, n)
    assert rate_interval(0, 0) is None
    with pytest.raises(ValueError, match="0 <= collapsed <= runs, got 6 of 5"):
        rate_interval(6, 5)
    with pytest.raises(ValueError, match="integers"):
        rate_interval(1.0, 5)  # type: ignore[arg-type]


def test_fisher_exact_p() -> None:
    assert fisher_p(0, 10, 3, 10, "less") == pytest.approx(120 / 1140)  # ~0.105
    assert fisher_p(0, 5, 2, 5, "less") == pytest.approx(10 / 45)  # ~0.222
    assert fisher_p(0, 20, 6, 20, "less") == pytest.approx(fisher_less_by_hand(0, 20, 6, 20))
    assert fisher_p(1, 20, 6, 20, "less") == pytest.approx(fisher_less_by_hand(1, 20, 6, 20))
    assert fisher_p(3, 10, 0, 10, "less") == pytest.approx(1.0)  # more collapses: no evidence of fewer
    assert fisher_p(0, 10, 3, 10, "two-sided") == pytest.approx(2 * 120 / 1140)  # symmetric margins
    assert fisher_p(0, 5, 0, 5, "two-sided") == 1.0
    assert fisher_p(0, 0, 2, 5, "less") is None
    with pytest.raises(ValueError, match=r"arm b.*got 6 of 5"):
        fisher_p(0, 5, 6, 5)


def test_mean_t_interval() -> None:
    m = mean_interval([0.0, 1.0, 2.0, 3.0, 4.0])
    assert m is not None and m.n == 5 and m.mean == 2.0
    half = T95_DF4 * math.sqrt(2.5 / 5)  # sample variance 2.5
    assert (m.low, m.high) == pytest.approx((2 - half, 2 + half))
    assert (m.low, m.high) == pytest.approx((0.0368, 3.9632), abs=1e-4)
    one = mean_interval([0.3])
    assert one is not None and (one.mean, one.low, one.high) == (0.3, None, None)
    same = mean_interval([0.2, 0.2, 0.2])
    assert same is not None and same.low == same.high == pytest.approx(0.2)
    assert mean_interval([]) is None
    with pytest.raises(ValueError, match="finite"):
        mean_interval([0.1, math.nan])


# ----------------------------------------------------------------------------------------------
# records: steps wasted and the arms

COLLAPSE = [0.3] * 5 + [0.01] * 95  # labelled collapse at step 14 of 100


def _record(
    setting: Setting | dict[str, Any],
    seed: int,
    rewards: list[float],
    *,
    last_step: int | None = None,
    rollbacks: Any = None,
    status: str = "finished",
    group: str | None = None,
) -> dict[str, Any]:
    """A run record as the runner writes it; `setting` a raw dict for a record of older code."""
    as_dict = setting.as_dict() if isinstance(setting, Setting) else setting
    group = group or (setting.key if isinstance(setting, Setting) else "old")
    record: dict[str, Any] = {
        "key": f"{group}_s{seed}",
        "group": group,
        "seed": seed,
        "setting": as_dict,
        "run_name": f"{group}_s{seed}",
        "status": status,
        "run": {"last_step": len(rewards) if last_step is None else last_step, "phase": "healthy"},
        "reward": {"steps": list(range(1, len(rewards) + 1)), "values": rewards},
        "alerts": [],
        "phases": [],
        "directives": [],
    }
    if rollbacks is not None:
        record["rollbacks"] = rollbacks
    return record


def test_steps_wasted_without_and_with_rollbacks() -> None:
    off = Setting(steps=100)
    collapsed = analyse(_record(off, 0, COLLAPSE))
    assert collapsed.collapse_step == 14 and collapsed.steps_after_collapse == 86
    assert (collapsed.rollbacks, collapsed.steps_redone, collapsed.steps_wasted) == (0, 0, 86)
    healthy = analyse(_record(off, 1, [0.3] * 100))
    assert (healthy.collapse_step, healthy.steps_wasted) == (None, 0)
    stopped = analyse(_record(off, 2, COLLAPSE, last_step=14))  # stopped at the collapse: nothing after
    assert stopped.steps_after_collapse == 0 and stopped.steps_wasted == 0

    rollbacks = [
        {"from_step": 60, "to_step": 40, "reason": "collapse critical"},
        {"from_step": 90, "to_step": 85},
    ]
    healed = analyse(_record(off, 3, [0.3] * 100, rollbacks=rollbacks))
    assert (healed.rollbacks, healed.steps_redone, healed.steps_after_collapse, healed.steps_wasted) == (
        2,
        25,
        0,
        25,
    )
    both = analyse(_record(off, 4, COLLAPSE, rollbacks=[{"from_step": 30, "to_step": 10}]))
    assert (both.steps_after_collapse, both.steps_redone, both.steps_wasted) == (86, 20, 106)
    assert analyse(_record(off, 5, [0.3] * 100, rollbacks=[])).steps_wasted == 0

    # per arm: sums and the mean over the finished runs
    records = [_record(off, 0, COLLAPSE), _record(off, 1, [0.3] * 100, rollbacks=rollbacks)]
    records.append(_record(off, 2, COLLAPSE, status="failed"))  # not counted
    (g,) = group_stats(records)
    assert (g.steps_after_collapse, g.steps_redone, g.rollbacks, g.steps_wasted) == (86, 25, 2, 111)
    assert g.steps_wasted_mean == pytest.approx(55.5)


def test_a_run_stopped_in_collapse_counts_as_collapsed() -> None:
    """Policy `heal` out of rollbacks stops the run: the service's phase says collapse, the series ends
    too soon for the rule (a peak, then 10 steps below 20 % of it). Counting it as healthy would credit
    the policy that stopped it: it is a collapse at the step the run entered phase III."""
    heal = Setting(steps=100, llds="heal")
    rewards = [0.3] * 40 + [0.25, 0.2, 0.02]  # the reward falls at 41-43, where the run is stopped

    def stopped_record(phase: str, last_step: int) -> dict[str, Any]:
        record = _record(heal, 0, rewards, last_step=last_step)
        record["run"]["phase"] = phase
        record["phases"] = [{"step": 42, "phase": "collapse", "previous_phase": "healthy"}]
        return record

    stopped = analyse(stopped_record("collapse", 43))
    assert (stopped.collapse_step, stopped.stopped_in_collapse, stopped.steps_after_collapse) == (42, True, 1)
    (g,) = group_stats([stopped_record("collapse", 43), _record(heal, 1, [0.3] * 100)])
    assert (g.collapsed, g.finished, g.collapse_steps) == (1, 2, (42,))
    # the same series, but the run went on to its planned steps and recovered: the rule decides
    recovered = analyse(stopped_record("healthy", 100))
    assert (recovered.collapse_step, recovered.stopped_in_collapse) == (None, False)
    # ... and a labelled collapse keeps its label
    labelled = _record(heal, 2, COLLAPSE, last_step=30)
    labelled["run"]["phase"] = "collapse"
    labelled["phases"] = [{"step": 20, "phase": "collapse", "previous_phase": "healthy"}]
    assert (analyse(labelled).collapse_step, analyse(labelled).stopped_in_collapse) == (14, False)
    rendered = render_markdown(summary_payload([stopped_record("collapse", 43)]))
    assert "| 42 (stopped) |" in rendered


@pytest.mark.parametrize(
    ("rollbacks", "message"),
    [
        ({"from_step": 3, "to_step": 1}, r"rollbacks: expected a list"),
        ([[60, 40]], r"rollbacks\[0\]: expected an object"),
        ([{"from_step": 60}], r"rollbacks\[0\]: to_step must be an integer >= 0, got None"),
        ([{"from_step": 60, "to_step": 40}, {"from_step": 5.5, "to_step": 1}], r"rollbacks\[1\]: from_step"),
        ([{"from_step": 60, "to_step": -1}], r"to_step must be an integer >= 0, got -1"),
        ([{"from_step": 40, "to_step": 60}], r"to_step 60 is after from_step 40"),
    ],
)
def test_malformed_rollbacks_name_the_run_and_the_entry(rollbacks: Any, message: str) -> None:
    record = _record(Setting(steps=100), 7, [0.3] * 100, rollbacks=rollbacks)
    with pytest.raises(ValueError, match=r"run record '.*_s7': .*" + message):
        analyse(record)


def _arm(mode: str, lr: float = 7e-4, lam: float | None = 0.2, policy: str | None = None) -> Setting:
    return Setting(lr=lr, steps_per_generation=4, steps=100, llds=mode, llds_lambda=lam, policy=policy)  # type: ignore[arg-type]


def _runs(setting: Setting, collapsed: int, n: int, *, healthy: float = 0.3) -> list[dict[str, Any]]:
    return [_record(setting, s, COLLAPSE if s < collapsed else [healthy] * 100) for s in range(n)]


def test_arms_are_paired_within_the_same_other_settings() -> None:
    late = {mode: _arm(mode, lam=None if mode == "off" else 0.2) for mode in ("off", "on", "auto", "heal")}
    early_off, early_auto = _arm("off", lr=1e-3, lam=None), _arm("auto", lr=1e-3)
    overridden = _arm("auto", policy="alert")  # the mode's switch disabled: not the `auto` arm
    records = [
        *_runs(late["off"], 3, 10),
        *_runs(late["on"], 0, 10),
        *_runs(late["auto"], 0, 10),
        *_runs(late["heal"], 1, 10),
        *_runs(overridden, 2, 10),
        *_runs(early_auto, 4, 5),
        *_runs(early_off, 5, 5),
    ]
    groups = {g.group: g for g in group_stats(records)}
    g_off, g_on, g_auto, g_heal = (groups[late[m].key] for m in ("off", "on", "auto", "heal"))
    assert [g.arm for g in (g_off, g_on, g_auto, g_heal)] == ["off", "on", "auto", "heal"]
    assert groups[overridden.key].arm == "auto (policy alert)"
    assert g_off.block == g_on.block == g_heal.block == "tiny_lr0.0007_spg4_g4_len96_n100"
    assert groups[early_off.key].block == "tiny_lr0.001_spg4_g4_len96_n100"
    assert g_off.p_vs_off is None and g_off.off_group is None
    assert g_on.off_group == g_auto.off_group == g_heal.off_group == late["off"].key
    assert g_on.p_vs_off == pytest.approx(120 / 1140) and g_auto.p_vs_off == pytest.approx(120 / 1140)
    assert g_heal.p_vs_off == pytest.approx(fisher_less_by_hand(1, 10, 3, 10))
    assert groups[overridden.key].p_vs_off == pytest.approx(fisher_less_by_hand(2, 10, 3, 10))
    early = groups[early_auto.key]
    assert early.off_group == early_off.key and early.p_vs_off == pytest.approx(
        fisher_less_by_hand(4, 5, 5, 5)
    )

    tests = {(c.group_a, c.group_b, c.alternative): c for c in compare_arms(list(groups.values()))}
    two_sided = {(a, b) for a, b, alt in tests if alt == "two-sided"}
    assert two_sided == {(late["on"].key, late["auto"].key), (late["auto"].key, late["heal"].key)}
    heal_vs_auto = tests[(late["auto"].key, late["heal"].key, "two-sided")]
    assert (heal_vs_auto.a, heal_vs_auto.b, heal_vs_auto.p) == ("auto", "heal", 1.0)
    assert all(c.block == groups[c.group_b].block for c in tests.values())  # never across blocks
    assert len(tests) == 4 + 1 + 2  # 4 late arms and 1 early arm vs off, 2 two-sided


def test_pairing_ignores_lambda_for_off_but_not_between_llds_arms() -> None:
    on, auto = _arm("on", lam=0.2), _arm("auto", lam=0.1)
    groups = group_stats([*_runs(_arm("off", lam=None), 1, 3), *_runs(on, 0, 3), *_runs(auto, 0, 3)])
    comparisons = compare_arms(groups)
    assert {(c.a, c.b) for c in comparisons} == {("on", "off"), ("auto", "off")}  # no on vs auto


def test_records_without_newer_setting_keys_pair_with_newer_ones() -> None:
    """A record written before an axis existed (no `reward_design`, `beta`) is the same block as a new
    record with those axes at their defaults."""
    new_heal = _arm("heal")
    old_off = {k: v for k, v in _arm("off", lam=None).as_dict().items() if k not in ("reward_design", "beta")}
    records = [_record(old_off, s, COLLAPSE if s < 2 else [0.3] * 100, group="old-off") for s in range(5)]
    groups = group_stats([*records, *_runs(new_heal, 0, 5)])
    assert groups[1].off_group == groups[0].group and groups[1].p_vs_off == pytest.approx(10 / 45)


def test_summary_table_has_the_numbers() -> None:
    off, on, heal = _arm("off", lam=None), _arm("on"), _arm("heal")
    rollbacks = [{"from_step": 50, "to_step": 30}]
    records = [
        *_runs(off, 3, 10),
        *[_record(on, s, [0.2 + 0.1 * (s % 2)] * 100) for s in range(10)],  # best/final 0.2 or 0.3
        _record(heal, 0, [0.4] * 100, rollbacks=rollbacks),  # one run: no interval
    ]
    payload = summary_payload(records, {"command": "lldmon lab run --preset late"})
    text = json.dumps(payload, allow_nan=False)  # strict JSON
    back = json.loads(text)
    assert back["statistics"] == STATISTICS_TEXT and len(back["comparisons"]) == 2
    g_off, g_on, _ = back["groups"]
    # the fields the summary had before stay
    assert {"group", "runs", "finished", "collapsed", "collapse_rate", "median_best_reward", "seeds"} <= set(
        g_off
    )
    assert g_off["collapse_ci"] == pytest.approx(list(wilson(3, 10)))
    on_ci = mean_interval([0.2 + 0.1 * (s % 2) for s in range(10)])
    assert on_ci is not None and g_on["final_reward_ci"] == pytest.approx([on_ci.low, on_ci.high])

    md = render_markdown(payload)
    block = "tiny_lr0.0007_spg4_g4_len96_n100"
    off_low, off_high = wilson(3, 10)
    on_low, on_high = wilson(0, 10)
    off_final = mean_interval([0.01] * 3 + [0.3] * 7)
    assert off_final is not None and off_final.low is not None and off_final.high is not None
    assert (
        f"| {block} | off | 10 | 3/10 | 30.0% [{off_low:.1%}, {off_high:.1%}] | - | 0.300 [0.300, 0.300] | "
        f"{off_final.mean:.3f} [{off_final.low:.3f}, {off_final.high:.3f}] | 258 (25.8/run) |"
    ) in md
    assert (
        f"| {block} | on | 10 | 0/10 | 0.0% [0.0%, {on_high:.1%}] | 0.105 | "
        f"0.250 [{on_ci.low:.3f}, {on_ci.high:.3f}] | 0.250 [{on_ci.low:.3f}, {on_ci.high:.3f}] | 0 (0.0/run) |"
    ) in md
    assert on_low == 0.0 and f"{on_high:.1%}" == "27.8%"
    heal_p = fisher_less_by_hand(0, 1, 3, 10)
    assert (
        f"| {block} | heal | 1 | 0/1 | 0.0% [0.0%, 79.3%] | {heal_p:.3f} | 0.400 [n/a] | 0.400 [n/a] | 20 (20.0/run) |"
        in md
    )
    assert f"| {block} | on | off | 0/10 | 3/10 | one-sided (a less) | 0.105 |" in md
    assert "Wilson score 95 % interval" in md and "one-sided Fisher exact" in md and "Student t" in md
    # the per-run table shows the steps wasted and where they came from
    assert "| 0 | 86 |" in md and "| 1 | 20 (0 + 20 redone) |" in md
    assert (
        md.index("## Per arm")
        < md.index("## Between arms")
        < md.index("## Per setting")
        < md.index("## Per run")
    )


# ----------------------------------------------------------------------------------------------
# the `heal` mode of the grid


def test_heal_mode_runs_auto_with_the_heal_policy() -> None:
    heal = Setting(llds="heal", llds_lambda=0.2, lr=7e-4, steps_per_generation=4)
    flags = heal.script_args()
    args = dict(zip(flags[::2], flags[1::2], strict=True))
    assert (args["--llds"], args["--policy"], args["--llds-lambda"]) == ("auto", "heal", "0.2")
    assert heal.key == "tiny_lr0.0007_spg4_g4_len96_llds-heal0.2_n400" and "-heal" in heal.key
    assert heal.as_dict()["policy"] == "heal" and heal.effective_policy == "heal"
    assert Setting(llds="heal", policy="alert").script_args()[-2:] == ["--policy", "alert"]
    assert set(DIRECTIVE_POLICIES) <= set(POLICIES) and "heal" in POLICIES
    assert Setting(policy="heal").effective_policy == "heal"
    with pytest.raises(GridError, match="policy must be one of"):
        Setting(policy="sometimes")
    runs = expand(resolve_grid(None, [], {"llds": ["off", "heal"], "llds_lambda": [0.2]}))
    assert {r.setting.llds for r in runs} == {"off", "heal"}


def test_presets_compare_four_arms_over_more_seeds() -> None:
    late = expand(resolve_grid("late"))
    assert {r.setting.llds for r in late} == {"off", "on", "auto", "heal"}
    assert sorted({r.seed for r in late}) == list(range(20)) and len(late) == 80
    assert {(r.setting.lr, r.setting.steps_per_generation, r.setting.steps) for r in late} == {(7e-4, 4, 400)}
    early = expand(resolve_grid("early"))
    assert {r.setting.llds for r in early} == {"off", "on", "auto", "heal"}
    assert sorted({r.seed for r in early}) == list(range(10)) and len(early) == 40
    assert {(r.setting.lr, r.setting.steps_per_generation, r.setting.steps) for r in early} == {(1e-3, 4, 80)}
    assert PRESETS["early"].get("llds_lambda") is None  # static `on` uses the script's lambda, as before


def test_scipy_stays_out_of_the_service_and_the_hooks() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("monitor", "trainer_hooks", "contracts")
        for path in (ROOT / package).rglob("*.py")
        if "scipy" in imported_roots(path)
    ]
    assert offenders == []
