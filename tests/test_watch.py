"""`lldmon watch PATH --run NAME`: a growing log streamed to a live service, exactly once.

Every test runs a real `lldmon serve` (SQLite and, when configured, PostgreSQL) and, except where the
watcher is driven in process to stop it at an exact point, `lldmon watch` as a subprocess while a
writer thread appends the log line by line (lines written in two halves, so partial lines happen).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from contracts import metrics as M
from monitor.cli import app
from monitor.watch import FINISHED, Service, Watcher, WatchState, state_file
from tests.conftest import live_server_on
from tests.live_server import LiveServer

pytestmark = pytest.mark.timeout(120)

OPTIONS = ("--interval", "0.05", "--state-dir")
EXE = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")


@pytest.fixture(scope="module")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server_on(backend, tmp_path_factory.mktemp(f"watch-{backend}")) as live:
        yield live


# ---------------------------------------------------------------------------------------------- helpers


def verl_line(step: int) -> str:
    """A verl file-logger line; step 7's grad norm is orjson's null (a non-finite value), step 9's
    entropy an infinity."""
    data: dict[str, Any] = {
        "actor/entropy": "inf" if step == 9 else 0.5 + step / 100,
        "critic/score/mean": step / 10,
        "actor/grad_norm": None if step == 7 else 1.0 + step,
    }
    return json.dumps({"step": step, "data": data})


def expected_verl(steps: range) -> dict[str, dict[int, Any]]:
    return {
        M.ENTROPY_MEAN: {s: "Infinity" if s == 9 else 0.5 + s / 100 for s in steps},
        M.REWARD_MEAN: {s: s / 10 for s in steps},
        M.GRAD_NORM: {s: "NaN" if s == 7 else 1.0 + s for s in steps},
    }


class Writer(threading.Thread):
    """Appends lines to a file one by one, each in two writes (a partial line sits there a moment);
    `between(i)` runs before line i (to rotate the file)."""

    def __init__(
        self,
        path: Path,
        lines: list[str],
        delay: float = 0.02,
        between: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.path, self.lines, self.delay, self.between = path, lines, delay, between
        self.written = 0

    def run(self) -> None:
        for i, line in enumerate(self.lines):
            if self.between is not None:
                self.between(i)
            half = len(line) // 2
            with open(self.path, "a") as handle:
                handle.write(line[:half])
                handle.flush()
                time.sleep(self.delay / 2)
                handle.write(line[half:] + "\n")
            self.written = i + 1
            time.sleep(self.delay / 2)


def watch(live: LiveServer, path: Path, run: str, state_dir: Path, *args: str) -> subprocess.Popen[str]:
    """`lldmon watch` as a subprocess, returned once it has started (said "watching")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLDMON_")}
    proc = subprocess.Popen(
        [
            EXE,
            "watch",
            str(path),
            "--run",
            run,
            "--url",
            live.url,
            "--project",
            "w",
            *OPTIONS,
            str(state_dir),
            *args,
        ],
        env={**env, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("watching"), first + proc.communicate(timeout=30)[0]
    return proc


def finished(proc: subprocess.Popen[str], timeout: float = 90) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def series_by_step(live: LiveServer, run: str) -> dict[str, dict[int, Any]]:
    run_id = live.run_id(run, project="w")
    return {name: dict(zip(s["steps"], s["values"], strict=True)) for name, s in live.series(run_id).items()}


def ledger_rows(live: LiveServer, run: str) -> int:
    """Rows the service's batch ledger accepted as new: a chunk stored twice under two ids shows here."""
    url = live.database_url or f"sqlite:///{live.data_dir / 'lldmon.db'}"
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            total = conn.execute(
                text(
                    "SELECT coalesce(sum(n_rows), 0) FROM ingest_batches WHERE run_id = :r AND kind = 'metrics'"
                ),
                {"r": live.run_id(run, project="w")},
            ).scalar_one()
    finally:
        engine.dispose()
    return int(total)


def n_values(series: dict[str, dict[int, Any]]) -> int:
    return sum(len(v) for v in series.values())


def wait_for(predicate: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def steps_on_server(live: LiveServer, run: str) -> int:
    try:
        return len(series_by_step(live, run).get(M.REWARD_MEAN, {}))
    except AssertionError:  # the run is not registered yet
        return 0


# ---------------------------------------------------------------------------------------------- tests


def test_verl_jsonl_streams_each_step_as_written(server: LiveServer, tmp_path: Path) -> None:
    """Steps arrive while the file grows (not only at the end), in order, with their values (NaN and inf
    kept); --until-idle exits 0 and --finish marks the run finished."""
    log = tmp_path / "metrics.jsonl"
    writer = Writer(log, [verl_line(s) for s in range(40)], delay=0.05)
    proc = watch(server, log, "jsonl", tmp_path / "state", "--until-idle", "3", "--finish")
    writer.start()
    wait_for(lambda: steps_on_server(server, "jsonl") >= 5)
    assert writer.written < 40, "steps must arrive while the log is still being written"
    writer.join()
    out = finished(proc)
    series = series_by_step(server, "jsonl")
    assert {k: series[k] for k in expected_verl(range(40))} == expected_verl(range(40))
    assert list(series[M.REWARD_MEAN]) == list(range(40))
    assert ledger_rows(server, "jsonl") == n_values(series)
    assert server.get(f"/runs/{server.run_id('jsonl', project='w')}")["status"] == FINISHED
    assert "sent 40 steps" in out and "idle" in out


def test_kill9_midway_and_restart_sends_every_step_once(server: LiveServer, tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    state = tmp_path / "state"
    writer = Writer(log, [verl_line(s) for s in range(60)], delay=0.04)
    proc = watch(server, log, "kill9", state)
    writer.start()
    wait_for(lambda: steps_on_server(server, "kill9") >= 15)
    proc.kill()  # SIGKILL: no cleanup, possibly between a send and the state update
    proc.communicate(timeout=30)
    time.sleep(0.3)  # the writer goes on while no watcher runs
    restarted = watch(server, log, "kill9", state, "--until-idle", "2")
    writer.join()
    finished(restarted)
    series = series_by_step(server, "kill9")
    assert {k: series[k] for k in expected_verl(range(60))} == expected_verl(range(60))
    assert ledger_rows(server, "kill9") == n_values(series)


def test_a_chunk_acknowledged_but_not_recorded_is_resent_as_a_duplicate(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The narrowest crash window: the service has the batch, the state still says pending. The
    restarted watcher re-sends the same bytes under the same id: a duplicate, never a second copy."""
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(verl_line(s) + "\n" for s in range(10)))
    stop = threading.Event()
    state = state_file(tmp_path / "state", log, server.api, "w", "window")
    real_save = WatchState.save

    def crash_on_commit(self: WatchState, file: Path) -> None:
        if self.pending is None and self.offset > 0:
            raise KeyboardInterrupt("killed")
        real_save(self, file)

    monkeypatch.setattr(WatchState, "save", crash_on_commit)
    service = Service(server.url, "window", "w", None, stop, lambda _: None)
    with pytest.raises(KeyboardInterrupt):
        Watcher(log, service, state, fmt="verl-jsonl", from_start=True, stop=stop, until_idle=1).run()
    service.close()
    assert WatchState.load(state, str(log)).pending is not None  # type: ignore[union-attr]
    monkeypatch.setattr(WatchState, "save", real_save)
    again = Service(server.url, "window", "w", None, threading.Event(), lambda _: None)
    summary = Watcher(log, again, state, fmt="verl-jsonl", until_idle=0.5, interval=0.05).run()
    again.close()
    assert summary.duplicates == 1 and again.sent == 0
    series = series_by_step(server, "window")
    assert {k: series[k] for k in expected_verl(range(10))} == expected_verl(range(10))
    assert ledger_rows(server, "window") == n_values(series)


def test_rotation_while_watching_and_while_down(server: LiveServer, tmp_path: Path) -> None:
    """Renamed and recreated (the old file's last line without its newline): both files' steps arrive;
    a rotation while no watcher runs is caught up from the renamed file."""
    log = tmp_path / "metrics.jsonl"
    state = tmp_path / "state"

    def rotate(i: int) -> None:
        if i == 20:
            with open(log, "a") as handle:  # a last line that never gets its newline
                handle.write(verl_line(20))
            time.sleep(0.2)
            log.rename(tmp_path / "metrics.jsonl.1")

    lines = [verl_line(s) for s in range(40)]
    lines[20] = verl_line(20)  # written again in the new file: a later value of the same step is fine
    proc = watch(server, log, "rotate", state)
    writer = Writer(log, lines, delay=0.03, between=rotate)
    writer.start()
    writer.join()
    wait_for(lambda: steps_on_server(server, "rotate") == 40)
    proc.send_signal(signal.SIGTERM)
    out = finished(proc, timeout=30)
    assert "rotated" in out
    # down: rotate again and write on
    log.rename(tmp_path / "metrics.jsonl.2")
    log.write_text("".join(verl_line(s) + "\n" for s in range(40, 50)))
    with open(tmp_path / "metrics.jsonl.2", "a") as handle:  # the old file got lines after the stop
        handle.write("".join(verl_line(s) + "\n" for s in range(40, 45)))
    finished(watch(server, log, "rotate", state, "--until-idle", "1.5"))
    series = series_by_step(server, "rotate")
    assert {k: series[k] for k in expected_verl(range(50))} == expected_verl(range(50))


def test_verl_console_from_its_end_unless_from_start(server: LiveServer, tmp_path: Path) -> None:
    """verl console lines (ANSI colours, Ray prefixes, other output in between) under canonical names;
    the first watch of an existing file starts at its end, like tail -f."""
    log = tmp_path / "train.log"

    def console_line(step: int) -> str:
        return (
            f"\x1b[36m(TaskRunner pid=7283)\x1b[0m step:{step} - actor/entropy:{0.5 + step / 100} - "
            f"critic/score/mean:np.float64({step / 10}) - actor/grad_norm:{'nan' if step == 7 else 1.0 + step}"
        )

    log.write_text("loading model...\n" + "".join(console_line(s) + "\n" for s in range(1, 4)))
    proc = watch(server, log, "console", tmp_path / "state", "--until-idle", "2", "--format", "verl-console")
    Writer(log, ["Training Progress: 10%"] + [console_line(s) for s in range(4, 12)]).run()
    finished(proc)
    series = series_by_step(server, "console")
    assert series[M.REWARD_MEAN] == {s: s / 10 for s in range(4, 12)}
    assert series[M.GRAD_NORM][7] == "NaN"
    assert series[M.ENTROPY_MEAN][11] == pytest.approx(0.61)


def test_trl_stdout_counts_steps_across_sigterm_and_restart(server: LiveServer, tmp_path: Path) -> None:
    """TRL prints no step: the importer's counting (one step per training dict, eval dicts join the
    current step) continues across a SIGTERM stop and a restart through the state file."""
    log = tmp_path / "stdout.txt"
    state = tmp_path / "state"

    def trl_line(i: int) -> str:
        bar = f"  {i}%|#         | {i}/100 [00:0{i % 10}<00:10]\r"
        return (
            bar
            + f"{{'loss': {i / 100}, 'grad_norm': {'nan' if i == 3 else 1.5}, 'reward': {i / 10}, 'epoch': 0.0{i}}}"
        )

    proc = watch(server, log, "trl", state, "--format", "trl-log")
    Writer(log, [trl_line(i) for i in range(1, 6)] + ["{'eval_loss': 0.9, 'epoch': 0.05}"]).run()
    wait_for(lambda: steps_on_server(server, "trl") == 5)
    proc.send_signal(signal.SIGTERM)
    finished(proc, timeout=30)
    saved = WatchState.load(state_file(state, log, server.api, "w", "trl"), str(log))
    assert saved is not None and saved.pending is None and saved.trl_step == 5
    Writer(log, [trl_line(i) for i in range(6, 9)]).run()  # written while no watcher runs
    finished(watch(server, log, "trl", state, "--until-idle", "1.5", "--format", "trl-log"))
    series = series_by_step(server, "trl")
    assert series[M.REWARD_MEAN] == {i: i / 10 for i in range(1, 9)}
    assert math.isnan(float(series[M.GRAD_NORM][3]))
    assert series["eval_loss"] == {5: 0.9}
    # every value once, plus step 5's epoch again if the eval dict (which logs it too) came in a later chunk
    assert n_values(series) <= ledger_rows(server, "trl") <= n_values(series) + 1


def test_usage_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["watch", str(tmp_path / "x.log"), "--run", "r", "--finish"])
    assert result.exit_code == 2 and "--finish needs --until-idle" in result.output
    result = runner.invoke(app, ["watch", str(tmp_path), "--run", "r"])
    assert result.exit_code == 2 and "is a directory" in result.output
    result = runner.invoke(app, ["watch", str(tmp_path / "x.log"), "--run", "r", "--format", "csv"])
    assert result.exit_code == 2


def test_a_run_the_service_refuses_is_a_one_line_error(server: LiveServer, tmp_path: Path) -> None:
    """A run the service will never accept (its name over the length limit: 422) ends the watch with
    one line naming it, exit 1, no traceback (401/403/404 take the same path)."""
    log = tmp_path / "m.jsonl"
    log.write_text(verl_line(0) + "\n")
    proc = watch(server, log, "x" * 5000, tmp_path / "state", "--from-start", "--until-idle", "1")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "registering run" in out
