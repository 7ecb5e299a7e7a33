"""Issue 16 #18: the example's per-step status line shows the LLDS state the trainer applies, not the
service's directive (`--llds on` with the directive off printed "LLDS off" while `llds/active` was 1).

Runs examples/search_r1_grpo.py for real (tiny model, 3 GRPO steps on CPU) against a live service
whose directive stays "LLDS off" (policy off)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.live_server import LiveServer

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "search_r1_grpo.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("server")).start() as live:
        yield live


def test_status_line_shows_llds_as_the_trainer_applies_it(server: LiveServer, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("bm25s", reason="the example's retriever needs bm25s (pip install -e '.[hooks]')")
    metrics = tmp_path / "metrics.jsonl"
    steps = 3
    # steps_per_generation 2: the LLDS term is live (with 1 it is a no-op and says so)
    args = ["--lldmon-url", server.url, "--run-name", "llds-status", "--policy", "off", "--llds", "on"]
    args += ["--steps", str(steps), "--warmup-steps", "0", "--batch-size", "4", "--num-generations", "2"]
    args += [
        "--steps-per-generation",
        "2",
        "--max-completion-length",
        "16",
        "--output-dir",
        str(tmp_path / "o"),
    ]
    args += ["--metrics-jsonl", str(metrics)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=280, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = server.run_id("llds-status", project="demo")
    assert server.get(f"/runs/{run_id}/directive")["llds"]["enabled"] is False  # the service says off
    active = [json.loads(line)["metrics"].get("llds/active") for line in metrics.read_text().splitlines()]
    assert active and all(a == 1.0 for a in active), active  # the trainer adds the term at every step
    lines = [line for line in done.stdout.splitlines() if re.search(r"\bstep \d+/\d+ ", line)]
    assert len(lines) == steps, done.stdout[-3000:]
    assert all(line.endswith("LLDS on") for line in lines), lines
