"""How long a test may wait before it calls something hung, from the environment.

`LLDMON_TEST_TIME_SCALE` (default 1) multiplies every such limit: the suite's own default and each
`@pytest.mark.timeout` (tests/conftest.py applies it), and the subprocess timeouts of the tests that
train a real model, run the demo or fuzz the API (`scaled`). The defaults fit an otherwise idle 2-core
machine with room to spare; a slower or busier one (another CPU-bound job beside the suite) sets a
larger factor instead of the tests guessing how busy the machine is. No test's verdict depends on
speed: a limit only turns a hang into a failure."""

from __future__ import annotations

import os


def _scale() -> float:
    raw = os.environ.get("LLDMON_TEST_TIME_SCALE", "1")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"LLDMON_TEST_TIME_SCALE must be a number, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"LLDMON_TEST_TIME_SCALE must be positive, got {raw!r}")
    return value


SCALE = _scale()


def scaled(seconds: float) -> float:
    """`seconds` times `LLDMON_TEST_TIME_SCALE`."""
    return seconds * SCALE
