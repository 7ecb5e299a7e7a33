"""The rollback lever in the directive contract: its wire fields, the parser's checks, and a trainer
acting on each rollback request once (also after a restart that acknowledged it)."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.directive import Directive, LeverTracker, LLDSDirective, parse_directive

WIRE: dict[str, Any] = {
    "llds": {"enabled": True, "lam": 0.3},
    "version": 7,
    "reason": "heal: run entered collapse (step 130)",
    "source": "detector",
    "step": 130,
    "checkpoint": 4,
    "stop": 0,
    "stop_reason": "",
    "stop_on_collapse": False,
    "rollback": 7,
    "rollback_to": 96,
    "lr_scale": 0.5,
    "applied_version": 5,
}


def test_the_wire_shape_round_trips() -> None:
    d = parse_directive(WIRE)
    assert d == Directive(
        llds=LLDSDirective(True, 0.3),
        version=7,
        reason=WIRE["reason"],
        source="detector",
        step=130,
        checkpoint=4,
        rollback=7,
        rollback_to=96,
        lr_scale=0.5,
        applied_version=5,
    )
    assert d.to_wire() == WIRE


def test_an_older_server_without_the_lever_reads_as_no_rollback() -> None:
    old = {k: v for k, v in WIRE.items() if k not in ("rollback", "rollback_to", "lr_scale")}
    d = parse_directive(old)
    assert d is not None and (d.rollback, d.rollback_to, d.lr_scale) == (0, None, 1.0)


@pytest.mark.parametrize(
    "bad",
    [
        {"rollback": -1},
        {"rollback": 1.5},
        {"rollback": True},
        {"rollback_to": -3},
        {"rollback_to": 9.5},
        {"rollback_to": "96"},
        {"lr_scale": 0},
        {"lr_scale": -0.5},
        {"lr_scale": float("nan")},
        {"lr_scale": float("inf")},
        {"lr_scale": True},
        {"lr_scale": "0.5"},
    ],
)
def test_a_malformed_rollback_field_makes_the_directive_malformed(bad: dict[str, Any]) -> None:
    assert parse_directive({**WIRE, **bad}) is None


def test_a_trainer_rolls_back_once_per_request() -> None:
    tracker = LeverTracker()
    first = tracker.take({**WIRE, "applied_version": 0})
    assert first.rollback and first.rollback_to == 96 and first.lr_scale == 0.5 and first.acknowledge == 7
    again = tracker.take({**WIRE, "applied_version": 0})
    assert not again.rollback and again.acknowledge is None
    newer = tracker.take({**WIRE, "version": 9, "rollback": 9, "rollback_to": 80, "applied_version": 7})
    assert newer.rollback and newer.rollback_to == 80


def test_a_restarted_trainer_does_not_repeat_an_acknowledged_rollback() -> None:
    levers = LeverTracker().take({**WIRE, "applied_version": 7})
    assert not levers.rollback and levers.rollback_to is None
    assert LeverTracker().take({**WIRE, "applied_version": 6}).rollback
