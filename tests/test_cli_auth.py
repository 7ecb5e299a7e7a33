"""`lldmon auth status|off` and the token commands: revoking the last token keeps auth on, only an
explicit (and logged) `auth off` opens the API again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from monitor.cli import app

runner = CliRunner()


def lldmon(tmp_path: Path, *args: str, input: str | None = None) -> tuple[int, str]:
    result = runner.invoke(app, [*args, "--data-dir", str(tmp_path)], input=input, env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_auth_stays_on_until_auth_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert lldmon(tmp_path, "auth", "status") == (
        0,
        "auth is off: no token exists, the API is open to anyone who can reach it\n",
    )
    assert lldmon(tmp_path, "token", "create", "--project", "nq")[0] == 0
    code, out = lldmon(tmp_path, "auth", "status")
    assert code == 0 and out.startswith("auth is on: 1 active token(s)"), out

    code, out = lldmon(tmp_path, "auth", "off")  # refused before asking
    assert code == 2 and out.count("\n") == 1, out
    assert "1 active token(s) (id 1): revoke them first" in out

    code, out = lldmon(tmp_path, "token", "revoke", "1")
    assert code == 0 and "token 1 revoked" in out and "auth is on: all 1 token(s) are revoked" in out, out
    code, out = lldmon(tmp_path, "auth", "status")
    assert code == 0 and "auth is on: all 1 token(s) are revoked" in out and "lldmon auth off" in out, out

    code, out = lldmon(tmp_path, "auth", "off", input="n\n")  # asks first
    assert code == 1 and "Aborted" in out, out
    assert "auth is on" in lldmon(tmp_path, "auth", "status")[1]

    with caplog.at_level(logging.WARNING, logger="lldmon"):
        code, out = lldmon(tmp_path, "auth", "off", input="y\n")
    assert code == 0 and "auth is off: deleted 1 revoked token(s)" in out, out
    assert any("auth turned off" in r.getMessage() for r in caplog.records)
    assert lldmon(tmp_path, "auth", "status")[1].startswith("auth is off")
    code, out = lldmon(tmp_path, "auth", "off", "--yes")
    assert code == 0 and "auth is already off" in out, out
