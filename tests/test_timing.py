"""`LLDMON_TEST_TIME_SCALE` (tests/timing.py): a factor from the environment, checked when read."""

from __future__ import annotations

import importlib

import pytest

import tests.timing as timing


@pytest.mark.parametrize(("raw", "factor"), [("1", 1.0), ("2.5", 2.5)])
def test_the_factor_multiplies_every_limit(monkeypatch: pytest.MonkeyPatch, raw: str, factor: float) -> None:
    monkeypatch.setenv("LLDMON_TEST_TIME_SCALE", raw)
    try:
        assert importlib.reload(timing).scaled(240) == 240 * factor
    finally:
        monkeypatch.undo()
        importlib.reload(timing)


@pytest.mark.parametrize("raw", ["fast", "0", "-2", "nan"])
def test_a_factor_that_is_not_a_positive_number_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("LLDMON_TEST_TIME_SCALE", raw)
    with pytest.raises(ValueError, match=f"LLDMON_TEST_TIME_SCALE must be .*{raw!r}"):
        timing._scale()


@pytest.mark.timeout(77)
def test_the_suite_scales_its_timeout_marks(request: pytest.FixtureRequest) -> None:
    """Its `timeout` mark, as the collection hook left it: 77 s times this session's factor."""
    mark = request.node.get_closest_marker("timeout")
    assert mark is not None and float(mark.args[0]) == pytest.approx(timing.scaled(77))
