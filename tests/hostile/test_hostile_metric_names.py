"""Hostile metric names through every entry point: one rule (`contracts.metrics.metric_name_problem`)
decides for the ingest API, every importer format, `lldmon import` locally and with --url, `lldmon
watch`'s parsers and the trainer hooks. A name it refuses is a 422 naming the key at the API; in a log
it is one `file:line: reason` and the rest of the log is imported."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from contracts.metrics import MAX_METRIC_NAME_LENGTH, metric_name_problem
from contracts.wire import API_PREFIX
from monitor.api.wire import decode_metrics
from monitor.cli import app
from monitor.errors import InvalidInput
from monitor.importers import load_log
from monitor.importers.detect import TRL_LOG, VERL_CONSOLE, VERL_JSONL
from monitor.importers.reading import Diagnostics, name_problem, text_lines
from monitor.watch import parse_chunk
from tests.conftest import live_server_on
from tests.live_server import LiveServer
from tests.monitor.api.helpers import history, new_run
from trainer_hooks._batching import Record, metrics_bodies

pytestmark = pytest.mark.timeout(180)

runner = CliRunner()
ENV = {"COLUMNS": "300", "LLDMON_URL": "", "LLDMON_TOKEN": ""}
STEPS = range(1, 41)
BAD_STEP = 5

SURROGATE = "bad\ud800key"
HOSTILE = {
    "surrogate": SURROGATE,
    "low-surrogate": "bad\udfffkey",
    "nul": "bad\x00key",
    "escape": "bad\x1b[2Jkey",
    "osc-title": "bad\x1b]0;pwned\x07key",
    "newline": "bad\nkey",
    "carriage-return": "bad\rkey",
    "del": "bad\x7fkey",
    "c1-csi": "bad\x9b31mkey",
}
"""Names no path may accept: not encodable as UTF-8, or control characters that forge terminal output,
log lines and table rows."""
TEXT_SAFE = {k: v for k, v in HOSTILE.items() if "surrogate" not in k}
"""What a text file decoded as UTF-8 can carry (undecodable bytes become U+FFFD, never a surrogate)."""
FINE = ["ok", "actor/entropy", "ü/λ", "reward (mean) 🎯", "a b", "x" * MAX_METRIC_NAME_LENGTH, "é"]


def test_the_rule_refuses_each_hostile_name_and_keeps_ordinary_ones() -> None:
    for name in HOSTILE.values():
        assert metric_name_problem(name) is not None, repr(name)
    for name in FINE:
        assert metric_name_problem(name) is None, repr(name)
    assert metric_name_problem("") == "empty metric name"
    assert metric_name_problem("x" * (MAX_METRIC_NAME_LENGTH + 1)) is not None
    assert metric_name_problem(3) is not None
    assert "'\\ud800'" in (metric_name_problem(SURROGATE) or "")  # the reason is printable itself
    assert "'\\x1b'" in (metric_name_problem(HOSTILE["escape"]) or "")


def _api_refuses(name: str) -> bool:
    body = json.dumps({"batch_id": "b", "steps": [0], "metrics": {name: [1.0]}}).encode()
    try:
        decode_metrics(body)
    except InvalidInput:
        return True
    return False


def _hooks_drop(name: str) -> bool:
    dropped: list[Any] = []
    metrics_bodies([Record("metrics", 0, {name: 1.0}, 0)], 10, lambda *a: dropped.append(a))
    return bool(dropped)


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=()), max_size=MAX_METRIC_NAME_LENGTH + 2))
def test_every_path_applies_the_same_rule(name: str) -> None:
    """Any text, lone surrogates and control characters included: the API, the importers and the
    trainer hooks refuse exactly what the shared rule refuses."""
    refused = metric_name_problem(name) is not None
    assert _api_refuses(name) == refused
    assert (name_problem(name) is not None) == refused
    assert _hooks_drop(name) == refused


# ----------------------------------------------------------------------------- every importer format


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def verl_jsonl(path: Path, bad: str) -> tuple[Path, int]:
    rows = [
        {
            "step": s,
            "data": {"actor/entropy": 0.5, "critic/score/mean": s / 10}
            | ({bad: 1.0} if s == BAD_STEP else {}),
        }
        for s in STEPS
    ]
    _jsonl(path / "run.jsonl", rows)
    return path / "run.jsonl", BAD_STEP


def swift_jsonl(path: Path, bad: str) -> tuple[Path, int]:
    rows = [
        {"loss": 0.1, "reward": s / 10, "global_step/max_steps": f"{s}/40"}
        | ({bad: 1.0} if s == BAD_STEP else {})
        for s in STEPS
    ]
    _jsonl(path / "logging.jsonl", rows)
    return path / "logging.jsonl", BAD_STEP


def trl_state(path: Path, bad: str) -> tuple[Path, int]:
    entries = [
        json.dumps({"step": s, "loss": 0.1, "reward": s / 10} | ({bad: 1.0} if s == BAD_STEP else {}))
        for s in STEPS
    ]
    target = path / "trainer_state.json"
    target.write_text('{"log_history": [\n' + ",\n".join(entries) + "\n]}\n", encoding="utf-8")
    return target, BAD_STEP + 1


def trl_stdout(path: Path, bad: str) -> tuple[Path, int]:
    lines = [
        repr({"loss": 0.1, "reward": s / 10, "step": s} | ({bad: 1.0} if s == BAD_STEP else {}))
        for s in STEPS
    ]
    target = path / "train.log"
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target, BAD_STEP


def verl_console(path: Path, bad: str) -> tuple[Path, int]:
    lines = [
        f"step:{s} - actor/entropy:0.5 - critic/score/mean:{s / 10}"
        + (f" - {bad}:1.0" if s == BAD_STEP else "")
        for s in STEPS
    ]
    target = path / "train.log"
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target, BAD_STEP


def _csv(path: Path, step_column: str, bad: str) -> tuple[Path, int]:
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([step_column, "reward/mean", bad, "grad/norm"])
        writer.writerows([[s, s / 10, 1.0, 2.0] for s in STEPS])
    return path, 1


def generic_csv(path: Path, bad: str) -> tuple[Path, int]:
    return _csv(path / "table.csv", "step", bad)


def wandb_csv(path: Path, bad: str) -> tuple[Path, int]:
    return _csv(path / "wandb.csv", "_step", bad)


def lldmon_parquet(path: Path, bad: str) -> tuple[Path, int]:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "step": list(STEPS),
            "reward/mean": [s / 10 for s in STEPS],
            bad: [1.0] * len(STEPS),
            "x": [2.0] * len(STEPS),
        }
    )
    pq.write_table(table, path / "export.parquet")
    return path / "export.parquet", 1


def tensorboard(path: Path, bad: str) -> tuple[Path, int]:
    pytest.importorskip("tensorboard")
    from tests.monitor.importers.test_tensorboard import simple, write_events

    events = [
        (
            s,
            [simple("actor/entropy", 0.5), simple("critic/score/mean", s / 10)]
            + ([simple(bad, 1.0)] if s == BAD_STEP else []),
        )
        for s in STEPS
    ]
    return write_events(path / "tb", 1_700_000_000, events), BAD_STEP + 1  # record 1: the file version


Builder = Callable[[Path, str], tuple[Path, int]]
FORMATS: dict[str, tuple[str, Builder, dict[str, str]]] = {
    "verl-jsonl": ("verl-jsonl", verl_jsonl, HOSTILE),
    "ms-swift": ("ms-swift", swift_jsonl, HOSTILE),
    "trl-state": ("trl-state", trl_state, HOSTILE),
    "trl-log": ("trl-log", trl_stdout, HOSTILE),
    # verl's console lines: colour codes (CSI) are stripped as the log's own; other controls stay
    "verl-console": (
        "verl-console",
        verl_console,
        {k: v for k, v in TEXT_SAFE.items() if k not in ("escape", "newline", "carriage-return", "c1-csi")},
    ),
    # a CSV header: newline and carriage return would end the header row, NUL is refused by the csv module
    "csv": (
        "csv",
        generic_csv,
        {k: v for k, v in TEXT_SAFE.items() if k not in ("newline", "carriage-return", "nul")},
    ),
    "wandb-csv": (
        "wandb-csv",
        wandb_csv,
        {k: v for k, v in TEXT_SAFE.items() if k not in ("newline", "carriage-return", "nul")},
    ),
    "lldmon": ("lldmon", lldmon_parquet, TEXT_SAFE),
    "tensorboard": ("tensorboard", tensorboard, TEXT_SAFE),
}
CASES = [pytest.param(fmt, key, id=f"{fmt}-{key}") for fmt, (_, _, names) in FORMATS.items() for key in names]


@pytest.mark.parametrize(("fmt", "key"), CASES)
def test_each_importer_skips_a_hostile_key_and_keeps_the_rest(tmp_path: Path, fmt: str, key: str) -> None:
    fmt_name, build, names = FORMATS[fmt]
    bad = names[key]
    path, line = build(tmp_path, bad)
    log = load_log([path], fmt_name)
    assert len(log) == len(STEPS), log.diagnostics
    assert bad not in log.values and all(metric_name_problem(n) is None for n in log.values)
    assert len(log.values) >= 2
    [diagnostic] = [d for d in log.diagnostics if "metric name" in d.reason]
    assert str(diagnostic).startswith(f"{path}:{line}: metric name")
    assert repr(bad)[:40] in diagnostic.reason  # the key, escaped


# --------------------------------------------------------------------------------------- lldmon watch


def _watch_lines(fmt: str, bad: str) -> list[str]:
    if fmt == VERL_JSONL:
        return [
            json.dumps({"step": s, "data": {"actor/entropy": 0.5} | ({bad: 1.0} if s == 2 else {})})
            for s in (1, 2, 3)
        ]
    if fmt == TRL_LOG:
        return [repr({"loss": 0.1} | ({bad: 1.0} if s == 2 else {})) for s in (1, 2, 3)]
    return [f"step:{s} - actor/entropy:0.5" + (f" - {bad}:1.0" if s == 2 else "") for s in (1, 2, 3)]


@pytest.mark.parametrize(
    ("fmt", "bad"),
    [
        (VERL_JSONL, SURROGATE),
        (VERL_JSONL, "bad\x1b[2Jkey"),
        (TRL_LOG, SURROGATE),
        (VERL_CONSOLE, "bad\x7fkey"),
    ],
)
def test_watch_parses_around_a_hostile_key(fmt: str, bad: str) -> None:
    """`lldmon watch` parses with the importers' line parsers: the key is reported, the steps kept (the
    batch it sends holds no name the service would refuse)."""
    diagnostics = Diagnostics()
    lines = list(text_lines("\n".join(_watch_lines(fmt, bad)) + "\n"))[:3]
    parsed = parse_chunk(fmt, lines, "train.log", diagnostics, 0)
    assert sorted(parsed.records) == [1, 2, 3]
    assert all(metric_name_problem(n) is None for row in parsed.records.values() for n in row)
    assert [str(d)[:25] for d in diagnostics.items] == ["train.log:2: metric name "]


# ------------------------------------------------------------------------------------------- the API


@pytest.mark.parametrize("key", list(HOSTILE))
def test_api_refuses_a_hostile_key_with_a_422_naming_it(client: Any, key: str) -> None:
    bad = HOSTILE[key]
    run_id = new_run(client)
    body = json.dumps({"batch_id": "b1", "steps": [0], "metrics": {"ok": [1.0], bad: [1.0]}}).encode()
    response = client.post(f"{API_PREFIX}/runs/{run_id}/metrics", content=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    expected = "metrics." + bad.encode("utf-8", "backslashreplace").decode("utf-8")
    assert error["field"] == expected and "metric name" in error["message"]
    assert history(client, run_id) == {}


# --------------------------------------------------------------------------- lldmon import, both ways


def _bad_log(tmp_path: Path) -> Path:
    path, _ = verl_jsonl(tmp_path, SURROGATE)
    return path


def _stored(db_url: str) -> tuple[str, int, set[str]]:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        status = conn.execute(text("SELECT status FROM runs")).scalar_one()
        steps = conn.execute(text("SELECT count(DISTINCT step) FROM step_metrics")).scalar_one()
        names = set(conn.execute(text("SELECT DISTINCT name FROM step_metrics")).scalars())
    engine.dispose()
    return str(status), int(steps), names


def test_local_import_skips_the_key_and_imports_every_step(tmp_path: Path, db_url: str) -> None:
    path = _bad_log(tmp_path)
    result = runner.invoke(app, ["import", str(path), "--run", "hostile", "--database-url", db_url], env=ENV)
    assert result.exit_code == 0, result.output
    assert f"{path}:{BAD_STEP}: metric name is not valid Unicode" in " ".join(result.output.split())
    assert "imported 40 steps (1-40)" in result.output
    assert _stored(db_url) == ("finished", 40, {"entropy/mean", "reward/mean"})


@pytest.fixture(scope="module")
def server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server_on(backend, tmp_path_factory.mktemp(f"names-{backend}")) as live:
        yield live


def test_remote_import_skips_the_key_and_sends_every_step(server: LiveServer, tmp_path: Path) -> None:
    path = _bad_log(tmp_path)
    args = ["import", str(path), "--run", "hostile-remote", "--chunk-steps", "7", "--url", server.url]
    result = runner.invoke(app, args, env=ENV)
    assert result.exit_code == 0, result.output
    assert f"{path}:{BAD_STEP}: metric name is not valid Unicode" in " ".join(result.output.split())
    assert "imported 40 steps (1-40)" in result.output
    runs = {r["name"]: r for r in _get(server, "/runs")}
    run = runs["hostile-remote"]
    assert run["status"] == "finished" and run["last_step"] == 40
    series = _get(server, f"/runs/{run['id']}/metrics")["series"]
    assert set(series) == {"entropy/mean", "reward/mean"}
    assert all(len(s["steps"]) == 40 for s in series.values())
    assert not math.isnan(float(series["reward/mean"]["values"][-1]))


def _get(server: LiveServer, path: str) -> Any:
    import httpx

    response = httpx.get(server.api + path, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()
