"""Package boundaries: trainer_hooks ships into training images; monitor never needs torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "trainer_hooks": {
        "monitor",
        "dashboard",
        "fastapi",
        "sqlalchemy",
        "dash",
        "alembic",
        "starlette",
        "psycopg",
    },
    "monitor": {"torch", "trainer_hooks", "dashboard", "transformers", "trl"},
    "contracts": {"monitor", "trainer_hooks", "dashboard", "torch", "fastapi", "sqlalchemy", "numpy"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_forbidden_imports(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_the_service_does_not_load_torch() -> None:
    code = "import sys, monitor.api.app, monitor.cli; assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_importing_trainer_hooks_does_not_load_the_server_stack() -> None:
    code = (
        "import sys, trainer_hooks, trainer_hooks.actions, contracts.metrics, contracts.wire\n"
        "bad = {'fastapi', 'sqlalchemy', 'dash', 'monitor'} & set(sys.modules)\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
