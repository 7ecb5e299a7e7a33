"""docs/architecture.md stays true: its rules table is exactly what tests/test_boundaries.py enforces,
and every module path and dotted name it writes in backticks exists.

Names are resolved from the source (files and `ast`), not by importing: the trainer side needs torch
and TRL, which a service-only environment does not have, and a page about packages must not depend on
which extras are installed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.test_boundaries import RULES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
HEADER = ["where", "rule", "modules"]
REPO_ROOTS = (
    "contracts",
    "lldmon_client",
    "lldmon_lab",
    "trainer_hooks",
    "monitor",
    "dashboard",
    "migrations",
    "tests",
    "docs",
)
"""A backticked name starting with one of these (then `.` or `/`, or alone) names something in the
repository."""

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
REFERENCE = re.compile(rf"(?:{'|'.join(REPO_ROOTS)})(?:[./][\w./-]*)?")

Rules = dict[tuple[str, str], frozenset[str]]


def _items(cell: str) -> list[str]:
    return [item.strip().strip("`").strip() for item in cell.split(",") if item.strip()]


def rules_table(markdown: str) -> Rules:
    """The `| where | rule | modules |` table as (where, rule) -> modules; `where` with several modules
    is written as test_boundaries writes it ("a, b")."""
    lines = markdown.splitlines()
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    starts = [i for i, row in enumerate(cells) if row == HEADER and lines[i].lstrip().startswith("|")]
    if len(starts) != 1:
        raise ValueError(f"expected one table with the header {HEADER}, found {len(starts)}")
    table: Rules = {}
    for line, row in zip(lines[starts[0] + 2 :], cells[starts[0] + 2 :], strict=False):
        if not line.lstrip().startswith("|"):
            break
        if len(row) != len(HEADER):
            raise ValueError(f"a rules row needs {len(HEADER)} cells: {line!r}")
        key = (", ".join(_items(row[0])), row[1])
        if key in table:
            raise ValueError(f"rule {key} is written twice")
        table[key] = frozenset(_items(row[2]))
    return table


def references(markdown: str) -> list[str]:
    """Backticked module paths and dotted names outside code blocks, in order of appearance."""
    spans = INLINE_CODE.findall(FENCE.sub("", markdown))
    return [span for span in spans if REFERENCE.fullmatch(span)]


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else None


def _definition(body: list[ast.stmt], name: str) -> ast.stmt | None:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return node
    return None


def missing(reference: str) -> str | None:
    """Why `reference` names nothing in the repository (None: it exists).

    A path must be a file or folder. A dotted name is the longest module prefix, then names defined
    in it: a class's attributes are its body's definitions, a name a module imports from another
    module (a package re-exporting) is looked up there."""
    if "/" in reference:
        return None if (ROOT / reference.rstrip("/")).exists() else "no such file or folder"
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is not None:
            break
    else:
        return "no such module"
    body: list[ast.stmt] = ast.parse(module.read_text(encoding="utf-8")).body
    rest = parts[cut:]
    for i, name in enumerate(rest):
        node = _definition(body, name)
        if node is None:
            return f"{'.'.join(parts[: cut + i])} defines no {name!r}"
        if isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                return f"{'.'.join(parts[: cut + i])} imports {name!r} relatively: write its defining module"
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            return missing(".".join([node.module, original, *rest[i + 1 :]]))
        if isinstance(node, ast.ClassDef):
            body = node.body
        elif i < len(rest) - 1:
            return f"{'.'.join(parts[: cut + i + 1])} is not a class: it has no {rest[i + 1]!r}"
    return None


def test_the_rules_table_is_what_test_boundaries_enforces() -> None:
    table = rules_table(DOC.read_text(encoding="utf-8"))
    assert table == RULES, (
        f"in the doc only: {sorted(set(table.items()) - set(RULES.items()))}; "
        f"in test_boundaries only: {sorted(set(RULES.items()) - set(table.items()))}"
    )


def test_every_backticked_module_and_name_exists() -> None:
    refs = references(DOC.read_text(encoding="utf-8"))
    assert "monitor.services.detection.DetectionService.process" in refs, "pattern broken?"
    broken = {ref: why for ref in refs if (why := missing(ref)) is not None}
    assert broken == {}


def test_the_name_check_finds_what_is_not_there() -> None:
    assert missing("monitor/services/detection.py") is None
    assert missing("monitor.detector.update") is None  # re-exported by the package
    assert missing("trainer_hooks.client.MonitorClient.directive") is None
    assert missing("monitor/services/nothing.py") == "no such file or folder"
    assert missing("monitor.services.detection.DetectionService.nothing") == (
        "monitor.services.detection.DetectionService defines no 'nothing'"
    )
    assert missing("monitor.services.detection.detector_inputs.x") is not None
    assert references("`monitored.x`, `monitor.x`, `POST /api/v1`, `lldmon watch`") == ["monitor.x"]


def test_the_table_reader_reports_what_it_cannot_read() -> None:
    good = "| where | rule | modules |\n|---|---|---|\n| `a`, `b` | does not load | `c`, the rest |\n\nafter"
    assert rules_table(good) == {("a, b", "does not load"): frozenset({"c", "the rest"})}
    with pytest.raises(ValueError, match="one table"):
        rules_table("no table here")
    with pytest.raises(ValueError, match="twice"):
        rules_table(good.replace("\n\nafter", "\n| `a`, `b` | does not load | `d` |"))
