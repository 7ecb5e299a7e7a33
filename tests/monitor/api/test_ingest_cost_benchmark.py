"""`benchmarks.ingest_cost` stays runnable: at a minimal size every request is acknowledged and timed, in
process and with each tree in an interpreter of its own (speed is not checked)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import ingest_cost

ROOT = Path(__file__).resolve().parents[3]


def tiny(**extra: object) -> argparse.Namespace:
    return argparse.Namespace(
        **{"steps": 3, "warmup": 1, "records": 16, "pg_url": "", "protocol": "separate", **extra}
    )


@pytest.mark.parametrize("protocol", ["separate", "combined"])
def test_one_round_times_every_measured_request(protocol: str) -> None:
    result = ingest_cost.one_round("sqlite", tiny(protocol=protocol), None)
    assert Path(result["monitor"]) == ROOT / "monitor"
    for kind in ingest_cost.KINDS if protocol == "separate" else ["combined"]:
        assert len(result["cpu_ms"][kind]) == 3 and all(ms > 0 for ms in result["wall_ms"][kind])
    assert result["postgres_ms_per_step"] is None


@pytest.mark.parametrize("protocol", ["separate", "combined"])
def test_compare_runs_each_tree_in_its_own_interpreter(protocol: str) -> None:
    result = ingest_cost.compare(tiny(baseline=str(ROOT), rounds=1, backends="sqlite", protocol=protocol))
    rows = result["summary"]["sqlite"]
    assert set(rows) == ({*ingest_cost.KINDS, "step"} if protocol == "separate" else {"step"})
    for row in rows.values():
        assert len(row["rounds_baseline_ms"]) == len(row["rounds_this_ms"]) == 1
        assert row["baseline_ms"] > 0 and row["this_ms"] > 0
