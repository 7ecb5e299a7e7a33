"""`lldmon demo --quick`: the real entry point, end to end, then the database read back through the
service layer (the demo has exited by then, so nothing is racing).

What must have landed:
- the TRL run: real training metrics (grad norm, reward, entropy, a likelihood level of correct or
  incorrect responses), TRL's tool metrics showing real `search` calls, action records, status
  finished, policy auto;
- the replayed collapse: phase events up to collapse, alerts, and the detector's LLDS directive.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from contracts import metrics as M
from tests.live_server import free_port
from tests.timing import scaled

TRAINING_PACKAGES = ("torch", "transformers", "trl", "datasets", "bm25s")
QUICK_STEPS = 6


def _missing() -> list[str]:
    return [name for name in TRAINING_PACKAGES if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    missing = _missing()
    if missing:
        pytest.skip(f"the demo's training needs {', '.join(missing)} (pip install -e '.[hooks]')")
    data_dir = tmp_path_factory.mktemp("demo")
    exe = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LLDMON_DATABASE_URL", None)
    proc = subprocess.run(
        [exe, "demo", "--quick", "--data-dir", str(data_dir), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=scaled(240),  # about 100 s on 2 idle cores: a 350-step warm-up, 6 GRPO steps
        env=env,
        stdin=subprocess.DEVNULL,
    )
    output = proc.stdout + proc.stderr
    train_log = data_dir / "train.log"
    assert proc.returncode == 0, output[-6000:] + (
        train_log.read_text()[-4000:] if train_log.exists() else ""
    )
    return data_dir, output


@pytest.mark.slow
def test_demo_prints_the_urls(quick_demo: tuple[Path, str]) -> None:
    _, output = quick_demo
    assert "/dashboard/" in output and "/docs" in output
    assert "[replay]" in output and "[train]" in output


@pytest.mark.slow
def test_demo_lands_real_training_and_detector_decisions(quick_demo: tuple[Path, str]) -> None:
    from monitor.api.app import build_state
    from monitor.config import Settings
    from monitor.domain import Principal, RunFilter

    data_dir, _ = quick_demo
    state = build_state(Settings(data_dir=data_dir))
    try:
        who = Principal()
        runs = {r.name: r for r in state.runs.list(who, RunFilter(project="demo"))}
        (train,) = [r for r in runs.values() if r.name.startswith("search-r1-")]
        (replay,) = [r for r in runs.values() if r.name.startswith("replay-collapse-")]

        # the TRL run: real metrics at every optimizer step
        assert train.status == "finished" and train.directive_policy == "auto"
        series = {s.name: s for s in state.query.history(who, train.id, None)}
        assert series[M.GRAD_NORM].steps == list(range(1, QUICK_STEPS + 1))
        assert all(math.isfinite(v) for v in series[M.GRAD_NORM].values)
        assert M.REWARD_MEAN in series and M.ENTROPY_MEAN in series
        assert all(0.0 <= v <= 1.0 for v in series[M.REWARD_MEAN].values)
        levels = series.get(M.LOGP_POS) or series.get(M.LOGP_NEG)
        assert levels is not None and levels.steps and all(v <= 0.0 for v in levels.values)
        calls = series["tools/call_frequency"].values  # TRL's: search calls per trajectory
        assert max(calls) > 0.5
        assert M.SEARCH_VALID_PER_TRAJ in series
        actions = state.query.actions(who, train.id, None, None, None, 50_000)
        assert actions["step"] and set(actions["source"]) <= {"loss", "probe"}
        assert all(1 <= s <= QUICK_STEPS for s in actions["step"])

        # the replayed collapse: the detector's decisions
        phases = [e.phase for e in state.query.phase_events(who, replay.id)]
        assert "decay" in phases and "collapse" in phases
        kinds = {a.kind for a in state.alerts.list(who, replay.id, None)}
        assert kinds, "no alert on the replayed collapse"
        directive = state.directives.current(who, replay.id)
        assert directive.llds.enabled and directive.source == "detector"
        assert replay.directive_policy == "auto"
    finally:
        state.db.dispose()


# ----------------------------------------------------------------------------------------------
# fast: how the demo finds and starts the training


def test_missing_examples_dir_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import monitor
    from lldmon_lab.demo import DemoError, examples_script

    assert examples_script().name == "search_r1_grpo.py"
    monkeypatch.setattr(monitor, "__file__", str(tmp_path / "site-packages" / "monitor" / "__init__.py"))
    with pytest.raises(DemoError, match=r"examples/ directory of the lldmon source checkout"):
        examples_script()


def test_training_command(tmp_path: Path) -> None:
    from lldmon_lab.demo import FULL_STEPS, DemoOptions, _training_command

    script = tmp_path / "search_r1_grpo.py"
    quick = _training_command(script, DemoOptions(quick=True), "http://h:1", "run-a", tmp_path)
    assert quick[:2] == [sys.executable, str(script)]
    args = dict(zip(quick[2::2], quick[3::2], strict=True))
    assert args["--steps"] == str(QUICK_STEPS) and args["--policy"] == "auto"
    assert args["--lldmon-url"] == "http://h:1" and args["--run-name"] == "run-a"
    assert args["--model"] == "tiny" and args["--project"] == "demo"
    full = _training_command(script, DemoOptions(steps=None), "http://h:1", "run-a", tmp_path)
    assert full[full.index("--steps") + 1] == str(FULL_STEPS)
    custom = _training_command(script, DemoOptions(quick=True, steps=3, model="smollm2"), "u", "r", tmp_path)
    assert custom[custom.index("--steps") + 1] == "3" and custom[custom.index("--model") + 1] == "smollm2"
