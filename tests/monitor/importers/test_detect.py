"""`--format auto`: by name, then by content; a clear error when it cannot tell."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.importers import LogImportError, detect_format, load_log, resolve_format
from tests.monitor.importers.helpers import FINQA_TRL, GSM8K_VERL, SEARCH_R1_GRPO, needs_real, verl_line


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("trainer_state.json", '{"log_history": []}', "trl-state"),
        ("state.json", '{"global_step": 1, "log_history": [{"step": 1}]}', "trl-state"),
        ("metrics.jsonl", "", "verl-jsonl"),
        ("metrics.log", '{"step": 0, "data": {"x": 1}}\n', "verl-jsonl"),
        ("history.csv", "_step,_runtime,loss\n", "wandb-csv"),
        ("history.csv", "", "csv"),  # no _step: a generic CSV (whose import names the missing column)
        ("export.csv", "step,loss\n0,1\n", "csv"),
        ("export.txt", "\ufeff_step,loss\n0,1\n", "wandb-csv"),
        ("export.txt", "global_step,reward\n0,1\n", "csv"),
        ("logging.jsonl", '{"loss": 0.1, "global_step/max_steps": "1/10"}\n', "ms-swift"),
        ("train.log", '{"loss": 0.1, "iteration": "1/10"}\n', "ms-swift"),
        ("old.jsonl", '{"loss": 0.1, "global_step": 5}\n', "ms-swift"),
        ("events.out.tfevents.1700000000.host", "", "tensorboard"),
        ("train.out", "loading...\n" + verl_line(0, x=1) + "\n", "verl-console"),
        ("train.out", "x\r  5%|#  {'loss': 0.1, 'grad_norm': 1.0, 'epoch': 0.0}\n", "trl-log"),
        # verl prints its config as Python dicts before the first step: the step line decides
        ("verl.out", "{'actor': 1, 'lr': 1e-06}\n" * 3 + verl_line(0, x=1) + "\n", "verl-console"),
    ],
)
def test_by_name_and_content(tmp_path: Path, name: str, content: str, expected: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert detect_format(path) == expected


def test_unknown_mixed_and_missing(tmp_path: Path) -> None:
    prose = tmp_path / "notes.txt"
    prose.write_text("nothing to see\n")
    with pytest.raises(LogImportError, match=r"cannot tell the format of .*notes\.txt.*pass --format"):
        detect_format(prose)
    a, b = tmp_path / "a.csv", tmp_path / "b.jsonl"  # a W&B export and verl's JSONL
    a.write_text("_step,x\n")
    b.write_text("")
    with pytest.raises(
        LogImportError, match=r"must have one format.*a\.csv: wandb-csv.*b\.jsonl: verl-jsonl"
    ):
        resolve_format([a, b])
    with pytest.raises(LogImportError, match=r"missing\.log: no such file"):
        load_log([tmp_path / "missing.log"])
    with pytest.raises(LogImportError, match=r"unknown format 'parquet'"):
        load_log([a], "parquet")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LogImportError, match="directory without TensorBoard event files"):
        detect_format(empty)


@needs_real
def test_real_logs() -> None:
    assert resolve_format(SEARCH_R1_GRPO) == "verl-console"  # config dicts come before the step lines
    assert detect_format(GSM8K_VERL) == "verl-console"
    assert detect_format(FINQA_TRL) == "trl-log"
