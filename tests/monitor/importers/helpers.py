"""Shared by the importer tests: where the real logs are, and small file builders."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lldmon_lab.scenarios import Scenario
from monitor.importers import VERL_NAMES

REAL = Path(__file__).resolve().parents[3].parent / "shared/datasets/real_runs"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"{REAL} (the shared real logs) is missing")
SEARCH_R1 = REAL / "wallace_searchr1_grpo_gigpo"
SEARCH_R1_GRPO = [
    SEARCH_R1 / "grpo__train_v2.pre_resume_step100.log",
    SEARCH_R1 / "grpo__train_v2_resume_from100.log",
]
FINQA_TRL = REAL / "wallace_finqa_trl_grpo/train_stage7_grpo_long2400_r32.log"
GSM8K_VERL = REAL / "verl_data_gsm8k_ppo/Qwen2.5-0.5B-bsz256_2-prompt1024-resp512-0.567.log"

RAY = "\x1b[36m(TaskRunner pid=7283)\x1b[0m "

VERL_FOR = {canonical: raw for raw, canonical in reversed(VERL_NAMES.items())}
"""Canonical name -> the name verl logs (the first of the table, the newer one, where there are two)."""


def verl_line(step: int, **metrics: object) -> str:
    return RAY + f"step:{step} - " + " - ".join(f"{k}:{v}" for k, v in metrics.items())


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """verl's FileLogger shape, non-finite values as the JSON tokens Python writes."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def scenario_jsonl(path: Path, scenario: Scenario) -> Path:
    """A generated run as verl writes it: verl's names where verl has one, orjson's null for NaN/inf."""
    rows = []
    for i, step in enumerate(scenario.steps.tolist()):
        data: dict[str, Any] = {}
        for name, values in scenario.values.items():
            if scenario.present[name][i]:
                value = float(values[i])
                data[VERL_FOR.get(name, name)] = value if math.isfinite(value) else None
        rows.append({"step": step, "data": data})
    return write_jsonl(path, rows)


def same_float(a: float, b: float) -> bool:
    """Equal, NaN included (an imported NaN comes back as NaN)."""
    return bool(np.isnan(a) and np.isnan(b)) or a == b
