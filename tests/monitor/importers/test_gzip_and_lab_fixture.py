"""`lldmon import` reads gzip-compressed text logs as they are (told by the magic bytes, with or without
`--format`) and recognises lldmon's recorded lab runs (`tests/fixtures/lab/*.jsonl.gz`), so a committed
example run is one command away (SQLite and PostgreSQL through `db_url`)."""

from __future__ import annotations

import gzip
import math
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from contracts import metrics as M
from lldmon_lab.lab.fixtures import read_fixture
from monitor.cli import app
from monitor.importers import LAB_FIXTURE, LogImportError, ParsedLog, detect_format, load_log
from tests.conftest import live_server_on
from tests.monitor.importers.helpers import verl_line

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "lab" / "tiny_lr0.0003_spg2_g4_len96_llds-off_n300_s0.jsonl.gz"
runner = CliRunner()
WIDE = {"COLUMNS": "240"}

TEXT_LOGS = [
    ("verl-jsonl", "metrics.jsonl", '{"step": 1, "data": {"actor/entropy": 0.5}}\n{"step": 2, "x": null}\n'),
    ("verl-console", "train.out", "loading\n" + verl_line(1, **{"actor/entropy": 0.5}) + "\n"),
    ("trl-log", "train.out", "{'loss': 0.1, 'grad_norm': 1.0, 'epoch': 0.5}\n"),
    (
        "trl-state",
        "trainer_state.json",
        '{"log_history": [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}]}',
    ),
    ("wandb-csv", "history.csv", "_step,loss\n0,1\n1,nan\n"),
    ("csv", "export.csv", "step,loss\n0,1\n1,2\n"),
    ("ms-swift", "logging.jsonl", '{"loss": 0.1, "global_step/max_steps": "1/10"}\n'),
]


def gzip_file(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data))
    return path


def assert_same_log(a: ParsedLog, b: ParsedLog) -> None:
    assert a.steps.tolist() == b.steps.tolist()
    assert sorted(a.values) == sorted(b.values)
    for name in a.values:
        np.testing.assert_array_equal(a.values[name], b.values[name])
        np.testing.assert_array_equal(a.present[name], b.present[name])


def lldmon_import(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["import", *args], env=WIDE)
    return result.exit_code, result.output


def stored(url: str) -> tuple[list[str], dict[tuple[str, int], float]]:
    """(run names, {(metric, step): value}) of the database."""
    engine = create_engine(url)
    with engine.connect() as conn:
        names = [str(r[0]) for r in conn.execute(text("SELECT name FROM runs ORDER BY id"))]
        rows = conn.execute(text("SELECT name, step, value FROM step_metrics")).all()
    engine.dispose()
    return names, {(str(n), int(s)): (math.nan if v is None else float(v)) for n, s, v in rows}


@pytest.mark.parametrize(("fmt", "name", "content"), TEXT_LOGS)
def test_every_text_format_reads_gzip_by_its_magic_bytes(
    tmp_path: Path, fmt: str, name: str, content: str
) -> None:
    plain = tmp_path / "plain" / name
    plain.parent.mkdir()
    plain.write_text(content, encoding="utf-8")
    expected = load_log([plain], fmt)
    assert expected.n_points > 0
    suffixed = gzip_file(tmp_path / "gz" / f"{name}.gz", content.encode())
    bare = gzip_file(tmp_path / "bare" / name, content.encode())  # gzip under the plain name
    for path in (suffixed, bare):
        assert detect_format(path) == fmt
        assert_same_log(load_log([path]), expected)
        assert_same_log(load_log([path], fmt), expected)


def test_committed_lab_fixture_is_detected_and_read_as_recorded() -> None:
    assert detect_format(FIXTURE) == LAB_FIXTURE
    log = load_log([FIXTURE])
    recorded = read_fixture(FIXTURE)
    assert log.run_name == recorded.header["name"]
    assert log.steps.tolist() == recorded.steps
    assert sorted(log.values) == sorted({k for row in recorded.rows for k in row})
    for name in log.values:
        steps, values = recorded.series(name)
        assert log.steps[log.present[name]].tolist() == steps
        np.testing.assert_array_equal(log.values[name][log.present[name]], values)


def test_import_a_committed_lab_fixture_in_one_command(tmp_path: Path, db_url: str) -> None:
    recorded = read_fixture(FIXTURE)
    code, output = lldmon_import(str(FIXTURE), "--database-url", db_url)
    assert code == 0, output
    name = recorded.header["name"]
    assert f"from 1 lab-fixture file(s) into run 1 {name!r}" in output
    names, values = stored(db_url)
    assert names == [name]
    expected = {
        (k, s): v for s, row in zip(recorded.steps, recorded.rows, strict=True) for k, v in row.items()
    }
    assert values.keys() == expected.keys()
    for key, value in expected.items():
        assert values[key] == value or (math.isnan(values[key]) and math.isnan(value)), key
    assert {s for _, s in values} == set(recorded.steps)

    # --run names the run instead of the header; a decompressed copy is the same format
    plain = tmp_path / "run.jsonl"
    with gzip.open(FIXTURE, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    code, output = lldmon_import(
        str(plain), "--run", "mine", "--format", "lab-fixture", "--database-url", db_url
    )
    assert code == 0, output
    assert stored(db_url)[0] == [name, "mine"]


@pytest.mark.parametrize("explicit", [False, True])
def test_import_gzipped_verl_jsonl(tmp_path: Path, db_url: str, explicit: bool) -> None:
    content = "".join(
        f'{{"step": {s}, "data": {{"actor/entropy": {0.5 - s / 100}, "critic/score/mean": {s / 10}}}}}\n'
        for s in range(1, 31)
    )
    path = gzip_file(tmp_path / "verl.jsonl.gz", content.encode())
    fmt = ["--format", "verl-jsonl"] if explicit else []
    code, output = lldmon_import(str(path), "--run", "v", *fmt, "--database-url", db_url)
    assert code == 0, output
    assert "imported 30 steps (1-30), 60 values" in output and "verl-jsonl" in output
    _, values = stored(db_url)
    assert values[(M.REWARD_MEAN, 30)] == 3.0 and values[(M.ENTROPY_MEAN, 1)] == 0.49


def test_gzip_of_an_unknown_format_is_one_line_naming_gzip_and_the_formats(tmp_path: Path) -> None:
    path = gzip_file(tmp_path / "notes.gz", b"nothing to see here\n" * 10)
    with pytest.raises(LogImportError, match=r"notes\.gz \(gzip-compressed.*pass --format \(.*lab-fixture"):
        detect_format(path)
    code, output = lldmon_import(str(path), "--run", "x", "--database-url", f"sqlite:///{tmp_path / 'db'}")
    assert code == 2
    assert output.strip().count("\n") == 0, output
    assert "gzip" in output and "verl-jsonl" in output and "lab-fixture" in output


def test_damaged_gzip_and_gzip_for_binary_formats_are_named(tmp_path: Path) -> None:
    damaged = tmp_path / "cut.jsonl.gz"
    damaged.write_bytes(gzip.compress(b'{"step": 1, "x": 1}\n' * 1000)[:60])
    with pytest.raises(LogImportError, match=r"cut\.jsonl\.gz: damaged gzip file"):
        load_log([damaged], "verl-jsonl")
    with pytest.raises(LogImportError, match=r"gzip-compressed, but lldmon files .* gunzip it first"):
        load_log([gzip_file(tmp_path / "export.parquet.gz", b"PAR1")], "lldmon")


def test_run_is_needed_when_the_log_does_not_name_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\n')
    code, output = lldmon_import(str(path), "--database-url", f"sqlite:///{tmp_path / 'db'}")
    assert code == 2 and "--run NAME is needed: a verl-jsonl log does not name its run" in output


def test_import_a_lab_fixture_over_http_keeps_its_name(backend: str, tmp_path: Path) -> None:
    name = read_fixture(FIXTURE).header["name"]
    with live_server_on(backend, tmp_path) as live:
        result = runner.invoke(
            app,
            ["import", str(FIXTURE), "--url", live.url],
            env={**WIDE, "LLDMON_URL": "", "LLDMON_TOKEN": ""},
        )
        assert result.exit_code == 0, result.output
        assert f"from 1 lab-fixture file(s) into run 1 {name!r}" in result.output
        runs = httpx.get(f"{live.api}/runs").json()
    assert [r["name"] for r in (runs["items"] if isinstance(runs, dict) else runs)] == [name]
