"""Deterministic given the seed (issue 13, item 2): `examples/search_r1_grpo.py` run twice in separate
processes with the same arguments, each streaming to a live lldmon service under policy `auto` (LLDS
`auto`: the trainer reads the service's directive at every step), logs the same metrics at every step,
to the last bit; a different seed does not.

Each run writes every metric the hooks send (`--metrics-jsonl`: TRL's scalars under canonical names,
`lld/*`, `llds/*`); only wall-time metrics (TRL's `step_time`) are left out of the comparison. The runs
are short (200 warm-up steps, after which some answers are right and GRPO's gradients not all zero, 6
GRPO steps, i.e. 3 rollout batches) and no detector fires that early, so everything is before the first
directive.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.timing import scaled

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "search_r1_grpo.py"

TIMING = re.compile(r"time|runtime|per_second")
"""Metric names measured in wall time (TRL's `step_time`, transformers' `train_runtime`, ...)."""

# three short real trainings (two warm-ups), one after the other: about 100 s on 2 idle cores
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(
    tmp_path: Path, url: str, name: str, seed: int, steps: int
) -> tuple[dict[int, dict[str, float]], str]:
    metrics = tmp_path / f"{name}.jsonl"
    command = [
        sys.executable,
        str(SCRIPT),
        "--model",
        "tiny",
        "--lldmon-url",
        url,
        "--run-name",
        name,  # one run per name: get-or-create would hand a second run the first one's directive
        "--policy",
        "auto",
        "--seed",
        str(seed),
        "--warmup-steps",
        "200",
        "--steps",
        str(steps),
        "--threads",
        "1",
        "--output-dir",
        str(tmp_path / name),
        "--metrics-jsonl",
        str(metrics),
        "--warmup-cache",
        str(tmp_path / "warmup-cache"),
    ]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "random"}
    env.pop("LLDMON_URL", None)
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=scaled(240), env=env, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {
        int(r["step"]): {k: v for k, v in r["metrics"].items() if not TIMING.search(k)} for r in rows
    }, proc.stdout


def _same(a: Any, b: Any) -> bool:
    return bool(a == b or (a != a and b != b))  # NaN == NaN here (a metric that is NaN in both runs)


def test_same_seed_same_metrics_at_every_step_other_seed_differs(tmp_path: Path) -> None:
    for module in ("torch", "trl", "bm25s"):
        pytest.importorskip(module)
    from tests.live_server import LiveServer

    with LiveServer(tmp_path / "server").start() as server:
        first, first_log = _run(tmp_path, server.url, "det-a", seed=0, steps=6)
        second, second_log = _run(tmp_path, server.url, "det-b", seed=0, steps=6)
        other, other_log = _run(tmp_path, server.url, "det-c", seed=1, steps=2)
        stored = [server.series(server.run_id(n, "demo")) for n in ("det-a", "det-b")]

    # the second run loads the first one's warm-up (`--warmup-cache`), the other seed trains its own:
    # the same metrics below also show that a cached warm-up changes nothing
    assert "warm-up: saved to" in first_log and "loaded from" not in first_log
    assert "warm-up: 200 steps loaded from" in second_log
    assert "warm-up: saved to" in other_log and "loaded from" not in other_log
    assert sorted(first) == sorted(second) == list(range(1, 7))
    for step in first:
        a, b = first[step], second[step]
        assert sorted(a) == sorted(b), f"step {step}: metric names differ: {sorted(set(a) ^ set(b))}"
        differ = {k: (a[k], b[k]) for k in a if not _same(a[k], b[k])}
        assert not differ, f"step {step}: same seed, different metrics: {differ}"
        expected = {"loss", "grad/norm", "entropy/mean", "llds/active"}
        if step % 2 == 1:  # first step of a rollout batch: TRL logs the rollout's metrics
            expected |= {"reward/mean", "tools/call_frequency", "turns/mean"}
        assert expected <= set(a), f"step {step}: missing {sorted(expected - set(a))}"
        assert a["llds/active"] == 0.0  # no directive so early: LLDS off in both runs
    # the comparison is not vacuous: the metrics move from step to step ...
    assert len({first[s]["entropy/mean"] for s in first}) > 1
    # ... the service stored the same series for both runs ...
    for name in ("reward/mean", "entropy/mean", "grad/norm"):
        assert stored[0][name]["values"] == stored[1][name]["values"], name
    # ... and another seed gives another run from the first step on
    assert any(not _same(first[1][k], other[1][k]) for k in ("entropy/mean", "loss", "turns/mean"))
