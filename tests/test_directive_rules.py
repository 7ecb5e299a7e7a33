"""One rule for a manual directive change (`contracts.directive.directive_problem`): the API and the local
CLI refuse the same lambdas and reasons, and accept the same ones (the local CLI used to take 1e9)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from contracts.directive import MAX_LLDS_LAMBDA, MAX_REASON_CHARS, directive_problem
from monitor.cli import app as cli_app

runner = CliRunner()
API = "/api/v1"

REFUSED: list[tuple[str, float, str]] = [
    ("huge lambda", 1e9, ""),
    ("negative lambda", -0.1, ""),
    ("nan lambda", float("nan"), ""),
    ("infinite lambda", float("inf"), ""),
    ("long reason", 0.3, "x" * (MAX_REASON_CHARS + 1)),
    ("NUL in the reason", 0.3, "before\x00after"),
]


def _version(client: Any, run_id: int) -> int:
    response = client.get(f"{API}/runs/{run_id}/directive")
    response.raise_for_status()
    return int(response.json()["version"])


@pytest.fixture
def run_id(client: Any) -> int:
    response = client.post(f"{API}/runs", json={"name": "rules", "project": "nq"})
    response.raise_for_status()
    return int(response.json()["id"])


@pytest.mark.parametrize(("case", "lam", "reason"), REFUSED, ids=[c[0] for c in REFUSED])
def test_api_and_local_cli_refuse_the_same_changes(
    client: Any, db_url: str, run_id: int, case: str, lam: float, reason: str
) -> None:
    field, _ = directive_problem(lam, reason) or ("", "")
    assert field in ("lam", "reason"), case
    # json.dumps writes NaN and Infinity as a lenient client would send them.
    raw = json.dumps({"llds": {"enabled": True, "lam": lam}, "reason": reason})
    api = client.put(
        f"{API}/runs/{run_id}/directive", content=raw, headers={"content-type": "application/json"}
    )
    assert api.status_code == 422, (case, api.text)

    args = ["directive", str(run_id), "--llds", "on", "--lambda", repr(lam), "--database-url", db_url]
    if reason:
        args += ["--reason", reason]
    local = runner.invoke(cli_app, args, env={"COLUMNS": "200"})
    assert local.exit_code != 0, (case, local.output)
    assert "Traceback" not in local.output
    assert ("lambda" in local.output) if field == "lam" else ("reason" in local.output), local.output
    assert _version(client, run_id) == 0  # nothing was recorded by either


def test_api_and_local_cli_accept_the_largest_lambda(client: Any, db_url: str, run_id: int) -> None:
    api = client.put(
        f"{API}/runs/{run_id}/directive", json={"llds": {"enabled": True, "lam": MAX_LLDS_LAMBDA}}
    )
    assert api.status_code == 200, api.text
    args = [
        "directive",
        str(run_id),
        "--llds",
        "on",
        "--lambda",
        str(MAX_LLDS_LAMBDA),
        "--database-url",
        db_url,
    ]
    local = runner.invoke(cli_app, args, env={"COLUMNS": "200"})
    assert local.exit_code == 0, local.output
    assert _version(client, run_id) == 2
