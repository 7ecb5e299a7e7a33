"""The README opens with exactly two set-up commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [b.strip() for b in blocks[:2]]


def test_two_single_line_setup_commands() -> None:
    main_job, tests = setup_commands()
    assert "\n" not in main_job and "\n" not in tests
    assert main_job.endswith("lldmon serve") and "-c constraints.txt" in main_job
    assert tests.endswith("pytest") and "-c constraints.txt" in tests


def test_ci_runs_the_readme_test_command() -> None:
    assert setup_commands()[1] in (ROOT / ".ci" / "run").read_text()
