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


def test_trl_quick_start_lets_llds_act() -> None:
    """The quick start's GRPOConfig gives LLDS displaced responses to act on (TRL's defaults do not)."""
    import ast

    from trainer_hooks.trl.measurement_parts import in_loss_deltas_structurally_zero

    readme = (ROOT / "README.md").read_text()
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "GRPOConfig(" in b)
    call = next(
        node
        for node in ast.walk(ast.parse(snippet.replace(", ...)", ")")))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "GRPOConfig"
    )
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
    ga, spg = kwargs["gradient_accumulation_steps"], kwargs["steps_per_generation"]
    assert not in_loss_deltas_structurally_zero(ga, spg, kwargs.get("num_iterations", 1))
    assert in_loss_deltas_structurally_zero(ga, ga, 1)  # the default the text warns about
