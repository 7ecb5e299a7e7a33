"""The directive's levers on the wire (issue 15): checkpoint/stop request ids, read tolerantly from
older servers, and a trainer acting once per request, also across a restart."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.directive import (
    APPLIED_VERSION_METRIC,
    Directive,
    Levers,
    LeverTracker,
    LLDSDirective,
    parse_directive,
)

LLDS = {"enabled": False, "lam": 0.2}


def test_wire_round_trip_and_older_servers() -> None:
    d = Directive(LLDSDirective(True, 0.3), 7, "r", "manual", 12, 6, 7, "why", True, 5)
    assert parse_directive(d.to_wire()) == d
    old = parse_directive({"llds": LLDS, "version": 3, "reason": "", "source": "manual", "step": 1})
    assert old is not None and (old.checkpoint, old.stop, old.stop_reason) == (0, 0, "")
    assert (old.stop_on_collapse, old.applied_version) == (False, 0)


@pytest.mark.parametrize(
    "levers",
    [{"checkpoint": -1}, {"checkpoint": "3"}, {"stop": True}, {"stop_reason": 3}, {"stop_on_collapse": 1}],
)
def test_malformed_levers_are_refused(levers: dict[str, Any]) -> None:
    assert parse_directive({"llds": LLDS, "version": 3, **levers}) is None


def wire(version: int, checkpoint: int = 0, stop: int = 0, applied: int = 0) -> dict[str, Any]:
    return {
        "llds": LLDS,
        "version": version,
        "checkpoint": checkpoint,
        "stop": stop,
        "stop_reason": "manual stop request" if stop else "",
        "applied_version": applied,
    }


def test_each_request_is_acted_on_once() -> None:
    t = LeverTracker()
    assert t.take(wire(0)) == Levers()
    assert t.take(wire(1, checkpoint=1)) == Levers(checkpoint=True, acknowledge=1)
    assert t.take(wire(1, checkpoint=1)) == Levers()  # the same directive again: nothing
    assert t.take(wire(2, checkpoint=1)) == Levers(acknowledge=2)  # an LLDS change: ack only
    levers = t.take(wire(3, checkpoint=3, stop=3))
    assert levers == Levers(True, True, "manual stop request", 3)
    assert levers.metrics() == {APPLIED_VERSION_METRIC: 3.0} and Levers().metrics() == {}
    assert t.take(None) == Levers() and t.take("garbage") == Levers()


def test_a_restarted_trainer_does_not_repeat_acknowledged_requests() -> None:
    # v4 asked for a stop and a trainer acknowledged it; the resumed job must not stop again,
    # but a request it has not acknowledged (v5's checkpoint) is still honoured.
    assert LeverTracker().take(wire(4, checkpoint=3, stop=4, applied=4)) == Levers()
    assert LeverTracker().take(wire(5, checkpoint=5, stop=4, applied=4)) == Levers(
        checkpoint=True, acknowledge=5
    )
