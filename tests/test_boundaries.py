"""Package boundaries: trainer_hooks ships into training images; monitor never needs torch.

The rules are data (`FORBIDDEN`, `CLIENT_ALLOWED_PACKAGES`, `CLIENT_USERS`, `NOT_LOADED`,
`SERVICE_NOT_LOADED`, `LAYERS`), gathered in `RULES`, so that docs/architecture.md's table can be
checked against exactly what these tests enforce (tests/test_architecture_doc.py)."""

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
    "monitor": {"torch", "trainer_hooks", "dashboard", "transformers", "trl", "lldmon_lab"},
    "lldmon_lab": {"torch", "trainer_hooks", "dashboard", "transformers", "trl"},
    "contracts": {
        "monitor",
        "trainer_hooks",
        "dashboard",
        "lldmon_client",
        "torch",
        "fastapi",
        "sqlalchemy",
        "numpy",
    },
}

CLIENT_ALLOWED_PACKAGES = frozenset({"httpx", "contracts", "lldmon_client"})
CLIENT_ALLOWED = {*CLIENT_ALLOWED_PACKAGES, *sys.stdlib_module_names}
"""lldmon_client ships into training images with trainer_hooks, and monitor's commands use it too: it
sits below both, beside contracts."""
CLIENT_USERS = ("trainer_hooks", "monitor", "lldmon_lab")
"""The packages that talk to the service through lldmon_client (and must keep doing so: one client)."""


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


def test_lldmon_client_imports_only_httpx_contracts_and_the_standard_library() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) - CLIENT_ALLOWED)
        for path in (ROOT / "lldmon_client").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("package", CLIENT_USERS)
def test_the_client_users_may_import_lldmon_client(package: str) -> None:
    assert "lldmon_client" not in FORBIDDEN[package]
    assert any("lldmon_client" in imported_roots(path) for path in (ROOT / package).rglob("*.py"))


SERVICE_NOT_LOADED = {"monitor.api.app, monitor.cli": ("torch", "lldmon_lab")}
"""What importing the service (its HTTP app and its CLI) must not load: the CLI finds the lab's commands
through entry points when it runs."""


@pytest.mark.parametrize("modules", sorted(SERVICE_NOT_LOADED))
def test_importing_the_service_does_not_load_torch_or_the_lab(modules: str) -> None:
    code = (
        f"import sys, {modules}\nbad = {set(SERVICE_NOT_LOADED[modules])!r} & set(sys.modules)\n"
        "assert not bad, f'{bad} loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


NOT_LOADED = {
    # what importing these modules must not load
    "trainer_hooks, trainer_hooks.actions, trainer_hooks.client, contracts.metrics, contracts.wire": (
        "fastapi",
        "sqlalchemy",
        "dash",
        "monitor",
    ),
    "lldmon_client": ("monitor", "trainer_hooks", "dashboard", "fastapi", "sqlalchemy", "dash", "numpy"),
}


@pytest.mark.parametrize("modules", sorted(NOT_LOADED))
def test_importing_a_client_package_does_not_load_the_server_stack(modules: str) -> None:
    code = (
        f"import sys, {modules}\nbad = {set(NOT_LOADED[modules])!r} & set(sys.modules)\nassert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


LAYERS = {
    # The detector is what the service runs; what labels, generates and scores runs is the lab's.
    "monitor/detector": ("lldmon_lab",),
    # The store writes plain domain objects; the alert rules, the services and HTTP sit above it.
    "monitor/store": ("monitor.alerting", "monitor.services", "monitor.api", "monitor.bootstrap"),
    # HTTP adapts requests onto the services built by monitor.bootstrap: never SQL of its own.
    "monitor/api": ("monitor.store", "monitor.db", "sqlalchemy"),
    # Sources of alert conditions hand them to the alerting service (plan -> store -> notify), and the
    # detector leaves the closed-loop directive rules to the directives service.
    "monitor/services/detection.py": (
        "monitor.alerting",
        "monitor.store.alerts",
        "monitor.services.directive_policy",
    ),
    "monitor/services/liveness.py": ("monitor.alerting", "monitor.store.alerts"),
    # The dashboard reads and writes through the service port (`monitor.ports`, satisfied by the
    # services the app hands it): no SQL of its own, none of the HTTP layer, no service internals.
    "dashboard": (
        "monitor.store",
        "monitor.db",
        "sqlalchemy",
        "monitor.api",
        "monitor.services",
        "monitor.bootstrap",
    ),
}


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_only_downwards(layer: str) -> None:
    forbidden = LAYERS[layer]
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if any(m == f or m.startswith(f + ".") for f in forbidden)
        )
        for path in ([ROOT / layer] if layer.endswith(".py") else (ROOT / layer).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


RULES: dict[tuple[str, str], frozenset[str]] = {
    **{(package, "must not import"): frozenset(names) for package, names in FORBIDDEN.items()},
    ("lldmon_client", "imports only"): CLIENT_ALLOWED_PACKAGES | {"the standard library"},
    **{(package, "imports"): frozenset({"lldmon_client"}) for package in CLIENT_USERS},
    **{(modules, "does not load"): frozenset(names) for modules, names in NOT_LOADED.items()},
    **{(modules, "does not load"): frozenset(names) for modules, names in SERVICE_NOT_LOADED.items()},
    **{(layer, "must not import"): frozenset(names) for layer, names in LAYERS.items()},
}
"""Every rule above as (where, rule) -> modules: the table docs/architecture.md must show as it is."""
