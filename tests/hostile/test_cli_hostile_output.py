"""What the CLI prints of user-supplied text, locally and with --url (the same commands against a real
`lldmon serve`, on both databases): run, project, tag and token names, directive reasons, alert texts and
delivery errors reach the terminal with their control characters written visibly (`\\x1b`, `\\n`) and
their rich markup as text, never as escape sequences, forged rows or styles. And a run reference of
Unicode digits (`²`) is a name, not an id: one line, never a ValueError traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import insert
from typer.testing import CliRunner

from monitor.cli import app
from monitor.cli._common import shown
from monitor.db.engine import make_engine
from monitor.db.models import Alert, AlertDelivery
from monitor.text import printable
from tests.conftest import live_server_on
from tests.live_server import LiveServer

pytestmark = pytest.mark.timeout(180)

runner = CliRunner()
ENV = {"COLUMNS": "400", "LLDMON_URL": "", "LLDMON_TOKEN": ""}

NAME = "evil\x1b[2J\x1b]0;pwned\x07\n│ 99 │ forged [red]x[/red] \u202eright\x9b31m"
PROJECT = "proj\x1b[31m\rforged"
TAG = "tag\x1b[5m"
TOKEN_NAME = "tok\x1b]8;;https://evil.example\x07link"
REASON = "why\x1b[2J\nforged reason"
MESSAGE = "alert\x1b[2J\nforged alert"
DELIVERY_ERROR = "receiver said \x1b]0;title\x07\nforged"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")
"""What must never reach the terminal from these texts."""


@dataclass
class Served:
    live: LiveServer
    local: list[str]
    token: str
    run_id: int
    digit_run_id: int

    def remote(self) -> list[str]:
        return ["--url", self.live.url, "--token", self.token]


def lldmon(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env=ENV)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def served(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp(f"hostile-cli-{backend}")
    with live_server_on(backend, tmp) as live:
        local = (
            ["--database-url", live.database_url] if live.database_url else ["--data-dir", str(live.data_dir)]
        )
        code, out = lldmon("token", "create", "--project", PROJECT, "--name", TOKEN_NAME, *local)
        assert code == 0, out
        token = out.strip().splitlines()[-1]
        headers = {"authorization": f"Bearer {token}"}
        with httpx.Client(base_url=live.api, headers=headers, timeout=30) as http:
            created = http.post("/runs", json={"name": NAME, "tags": [TAG]})
            assert created.status_code == 201, created.text
            run_id = int(created.json()["id"])
            changed = http.put(
                f"/runs/{run_id}/directive", json={"llds": {"enabled": True}, "reason": REASON}
            )
            assert changed.status_code == 200, changed.text
            stop = http.put(f"/runs/{run_id}/directive", json={"stop": True, "reason": REASON})
            assert stop.status_code == 200, stop.text
            digit = http.post("/runs", json={"name": "²"})
            assert digit.status_code == 201, digit.text
        _hostile_alert(live.database_url or f"sqlite:///{live.data_dir / 'lldmon.db'}", run_id)
        yield Served(live, local, token, run_id, int(digit.json()["id"]))


def _hostile_alert(url: str, run_id: int) -> None:
    """An alert whose text and delivery error carry escape sequences: the detector writes neither, but
    a receiver's error text is whatever it answered, and the CLI must not trust what it reads back."""
    engine = make_engine(url)
    with engine.begin() as conn:
        alert_id = conn.execute(
            insert(Alert.__table__)
            .values(
                run_id=run_id,
                kind="lld_collapse",
                severity="critical",
                status="open",
                message=MESSAGE,
                evidence={},
                first_step=1,
                last_step=2,
            )
            .returning(Alert.__table__.c.id)
        ).scalar_one()
        conn.execute(
            insert(AlertDelivery.__table__).values(
                alert_id=alert_id,
                sink="webhook:evil",
                event="firing",
                status="failed",
                attempts=3,
                last_error=DELIVERY_ERROR,
            )
        )
    engine.dispose()


def assert_safe(output: str, *texts: str) -> None:
    """No raw control character of the hostile texts, each of them shown visibly, markup as text."""
    for raw in RAW:
        assert raw not in output, (raw, output)
    flat = output.replace("\n", "")
    for text in texts:
        assert printable(text).replace("\n", "") in flat or _wrapped(printable(text), output), (text, output)


def _wrapped(text: str, output: str) -> bool:
    """`text` in `output` apart from table borders and wrapping (a narrow cell)."""
    squeeze = "".join(c for c in output if c not in "│┃ \n")
    return "".join(c for c in text if c not in "│┃ ") in squeeze


def _modes(served: Served) -> list[list[str]]:
    return [served.local, served.remote()]


def test_visible_and_shown() -> None:
    assert printable("a\x1b[2J\nb\x9b\u202e\ud800\x00\t") == "a\\x1b[2J\\nb\\x9b\\u202e\\ud800\\x00\\t"
    assert printable("plain ü/λ 🎯 [red]") == "plain ü/λ 🎯 [red]"
    assert shown("[red]x[/red]\x1b") == "\\[red]x\\[/red]\\x1b"


def test_runs_list(served: Served) -> None:
    for mode in _modes(served):
        code, out = lldmon("runs", "list", *mode)
        assert code == 0, out
        assert_safe(out, NAME, PROJECT, TAG)
        assert "[red]x[/red]" in out  # markup shown, not applied
        rows = [line for line in out.splitlines() if line.startswith("│")]
        assert len(rows) == 2, out  # the hostile run and the run named ²: no forged row


def test_runs_show_by_id_and_by_name(served: Served) -> None:
    for mode in _modes(served):
        for ref in (str(served.run_id), NAME):
            code, out = lldmon("runs", "show", ref, *mode)
            assert code == 0, out
            assert_safe(out, NAME, PROJECT, TAG, REASON, MESSAGE)


def test_unknown_hostile_name_is_one_safe_line(served: Served) -> None:
    for mode in _modes(served):
        code, out = lldmon("runs", "show", "no\x1b[2Jsuch\nrun", *mode)
        assert code == 1
        assert_safe(out)
        assert out.count("\n") == 1 and "no run is named 'no\\x1b[2Jsuch\\nrun'" in out


def test_alerts_list(served: Served) -> None:
    for mode in _modes(served):
        code, out = lldmon("alerts", "list", str(served.run_id), *mode)
        assert code == 0, out
        assert_safe(out, MESSAGE, DELIVERY_ERROR)


def test_directive(served: Served) -> None:
    for mode in _modes(served):
        code, out = lldmon("directive", str(served.run_id), *mode)
        assert code == 0, out
        assert_safe(out, REASON)
        assert out.count("\n") == 1  # one line, the reasons' newlines shown as \n


def test_token_create_and_list(served: Served) -> None:
    code, out = lldmon("token", "list", *served.local)
    assert code == 0, out
    assert_safe(out, PROJECT, TOKEN_NAME)
    code, out = lldmon("token", "create", "--project", PROJECT, "--name", "second", *served.local)
    assert code == 0, out
    assert_safe(out.rsplit("\n", 2)[0], PROJECT)


@pytest.mark.parametrize("ref", ["²", "①", "٣"])
def test_unicode_digits_are_a_run_name_not_an_id(served: Served, ref: str) -> None:
    """str.isdigit() is true for each of these, int() refuses '²' and '①' and reads '٣' as 3: only
    ASCII digits are an id."""
    for mode in _modes(served):
        code, out = lldmon("runs", "show", ref, "--json", *mode)
        if ref == "²":
            assert code == 0, out
            assert json.loads(out)["id"] == served.digit_run_id
            continue
        assert code == 1 and out.count("\n") == 1 and f"no run is named {ref!r}" in out, out
        for command in (["alerts", "list", ref], ["directive", ref], ["runs", "liveness", ref]):
            code, out = lldmon(*command, *mode)
            assert code == 1 and f"no run is named {ref!r}" in out, (command, out)


def test_export_of_a_unicode_digit_ref(served: Served, tmp_path: Path) -> None:
    for mode in _modes(served):
        code, out = lldmon("export", "①", "--output", str(tmp_path / "x.csv"), *mode)
        assert code == 1 and "no run is named '①'" in out, out
