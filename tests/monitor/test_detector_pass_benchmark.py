"""`benchmarks.detector_pass` stays runnable: at a minimal size it judges every streamed batch in both
modes and both copies of every run end judged alike (speed is not checked)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import detector_pass
from tests.conftest import PG_URL

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(PG_URL is None, reason="needs LLDMON_TEST_DATABASE_URL (a PostgreSQL server)"),
]


def test_quick_detector_pass_benchmark() -> None:
    args = argparse.Namespace(runs=2, steps=4, preload=250, pg_url=PG_URL, json=None)
    result = detector_pass.run_benchmark(args)
    assert result["identical"] and result["phase_events"] > 0
    for mode in detector_pass.MODES:
        assert result["modes"][mode]["passes"] == args.runs * args.steps
    assert set(result["off_over_on"]) == {
        "wall_ms_median",
        "wall_ms_mean",
        "service_cpu_ms_mean",
        "postgres_cpu_ms_mean",
    }
