"""verl `file` logger JSONL -> canonical metric columns."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from contracts import metrics as M
from monitor.importers import MalformedLog, load_verl_jsonl
from monitor.importers import reading as reading_module
from tests.monitor.importers.helpers import write_jsonl


def test_file_logger_lines_with_nonfinite_and_unicode(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(
        '{"step": 1, "data": {"actor/entropy": 0.5, "critic/score/mean": 0.1, "actor/grad_norm": 1.5}}\n'
        # orjson writes NaN and inf as null; Python's json as NaN / Infinity tokens
        '{"step": 2, "data": {"actor/entropy": null, "critic/score/mean": NaN, "actor/grad_norm": Infinity}}\n'
        "\n"
        '{"step": 3, "data": {"actor/grad_norm": "-inf", "critic/score/mean": "nan", "Größe/λ": 7}}\n'
        '{"step": 4, "data": {"val": {"test_score": {"gsm8k": 0.25}}, "actor/entropy_loss": 0.3}}\n'
        '{"step": 5, "actor/grad_norm": 2.0}\n',  # a flat line (no "data") is read too
        encoding="utf-8",
    )
    log = load_verl_jsonl(path)
    assert log.steps.tolist() == [1, 2, 3, 4, 5] and log.diagnostics == ()
    assert log.values[M.ENTROPY_MEAN][0] == 0.5 and log.values[M.ENTROPY_MEAN][3] == 0.3
    assert math.isnan(log.values[M.ENTROPY_MEAN][1]) and log.present[M.ENTROPY_MEAN][1]
    assert math.isnan(log.values[M.REWARD_MEAN][1]) and math.isnan(log.values[M.REWARD_MEAN][2])
    assert log.values[M.GRAD_NORM][[0, 1, 2, 4]].tolist() == [1.5, math.inf, -math.inf, 2.0]
    assert log.present[M.GRAD_NORM].tolist() == [True, True, True, False, True]
    assert log.values["Größe/λ"][2] == 7.0
    assert log.values["val/test_score/gsm8k"][3] == 0.25
    assert log.n_points == 12


def test_resumed_run_later_file_wins(tmp_path: Path) -> None:
    first = write_jsonl(
        tmp_path / "a.jsonl",
        [{"step": s, "data": {"actor/grad_norm": 1.0, "only_first": 1.0}} for s in range(0, 6)],
    )
    second = write_jsonl(
        tmp_path / "b.jsonl", [{"step": s, "data": {"actor/grad_norm": 2.0}} for s in range(4, 9)]
    )
    log = load_verl_jsonl([first, second])
    assert log.steps.tolist() == list(range(9))
    assert log.values[M.GRAD_NORM].tolist() == [1.0] * 4 + [2.0] * 5
    assert log.present["only_first"].tolist() == [True] * 4 + [False] * 5


def test_malformed_lines_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(
        '{"step": 0, "data": {"actor/grad_norm": 1.0}}\n'
        '{"step": 1, "data": {"actor/grad_norm": 1.1}\n'  # bad JSON: missing brace
        '{"data": {"actor/grad_norm": 1.2}}\n'  # no step
        '{"step": -3, "data": {"actor/grad_norm": 1.3}}\n'
        '{"step": 4, "data": {"actor/grad_norm": "high", "critic/score/mean": 0.4, "tags": [1]}}\n'
        "[1, 2]\n"
        '{"step": 5, "data": {"actor/grad_norm": 1.5}}\n'
        '{"step": 6, "data": {"actor/grad_no',  # truncated while the trainer was writing
        encoding="utf-8",
    )
    log = load_verl_jsonl(path)
    assert log.steps.tolist() == [0, 4, 5]
    assert log.values[M.REWARD_MEAN][1] == 0.4 and not log.present[M.GRAD_NORM][1]
    assert [str(d) for d in log.diagnostics] == [
        f"{path}:2: invalid JSON at column 45: Expecting ',' delimiter",
        f'{path}:3: no "step"',
        f"{path}:4: step is not a non-negative integer: -3",
        f"{path}:5: step 4: actor/grad_norm is not a number: 'high'",
        f"{path}:5: step 4: tags is not a number: [1]",
        f"{path}:6: not a JSON object: [1, 2]",
        f"{path}:8: invalid JSON at column 22: Unterminated string starting at "
        "(last line has no newline: truncated?)",
    ]
    with pytest.raises(MalformedLog, match=rf"^{path}:2: invalid JSON") as err:
        load_verl_jsonl(path, strict=True)
    assert (err.value.diagnostic.path, err.value.diagnostic.line) == (str(path), 2)


def test_streams_with_byte_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading_module, "PROGRESS_EVERY", 1000)
    path = write_jsonl(
        tmp_path / "run.jsonl", [{"step": s, "data": {"actor/grad_norm": s / 10}} for s in range(500)]
    )
    calls: list[int] = []
    log = load_verl_jsonl(path, progress=calls.append)
    assert len(log) == 500
    assert sum(calls) == path.stat().st_size and len(calls) > 10


def test_names_the_database_cannot_store_are_reported(tmp_path: Path) -> None:
    long_name = "x" * 300
    path = write_jsonl(
        tmp_path / "run.jsonl", [{"step": 0, "data": {long_name: 1.0, "nul\x00name": 2.0, "ok": 3.0}}]
    )
    log = load_verl_jsonl(path)
    assert list(log.values) == ["ok"]
    assert [d.reason[:40] for d in log.diagnostics] == [
        "metric name longer than 256 characters: ",
        "metric name contains the control charact",
    ]
