"""The CLI's remote mode (`--url`/`--token`) against a real `lldmon serve`, on both databases: each remote
command prints what its local twin prints for the same run, a token keeps to its project, and `import
--url` is idempotent (a second run is all duplicates)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from monitor.cli import app
from tests.conftest import live_server_on
from tests.live_server import LiveServer

runner = CliRunner()
BODY_LIMIT = 2000
"""The fixture server's body limit: a 200-step batch is over it and must be split."""
ENV = {"COLUMNS": "300", "LLDMON_URL": "", "LLDMON_TOKEN": ""}


@dataclass
class Served:
    live: LiveServer
    local: list[str]
    token: str
    other_token: str
    log: Path

    def remote(self, token: str | None = None) -> list[str]:
        return ["--url", self.live.url, "--token", token or self.token]


def lldmon(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env=ENV)
    return result.exit_code, result.output


def _token(local: list[str], project: str) -> str:
    code, out = lldmon("token", "create", "--project", project, *local)
    assert code == 0, out
    return out.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def served(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp(f"remote-{backend}")
    with live_server_on(
        backend, tmp, {"LLDMON_LIVENESS_SWEEP_SECONDS": "0.2", "LLDMON_MAX_BODY_BYTES": str(BODY_LIMIT)}
    ) as live:
        local = (
            ["--database-url", live.database_url] if live.database_url else ["--data-dir", str(live.data_dir)]
        )
        token, other = _token(local, "nq"), _token(local, "other")
        log = tmp / "train.csv"
        rows = [
            f"{s},{0.1 * s:.3f},{'nan' if s == 7 else -1.0 - 0.01 * s},{'inf' if s == 9 else 1.0}"
            for s in range(1, 41)
        ]
        log.write_text("step,reward/mean,lld/logp_pos,grad/norm\n" + "\n".join(rows) + "\n")
        yield Served(live, local, token, other, log)


def _import(served: Served, run: str, token: str | None = None) -> tuple[int, str]:
    return lldmon(
        "import",
        str(served.log),
        "--run",
        run,
        "--format",
        "csv",
        "--chunk-steps",
        "7",
        *served.remote(token),
    )


def _points(served: Served, run_id: int) -> dict[str, list[Any]]:
    response = httpx.get(
        f"{served.live.api}/runs/{run_id}/metrics", headers={"authorization": f"Bearer {served.token}"}
    )
    assert response.status_code == 200, response.text
    return {name: s["steps"] for name, s in response.json()["series"].items()}


def _run_id(served: Served, name: str) -> int:
    code, out = lldmon("runs", "list", "--json", *served.remote())
    assert code == 0, out
    [run] = [r for r in json.loads(out) if r["name"] == name]
    return int(run["id"])


def test_import_over_http_twice_stores_every_value_once(served: Served) -> None:
    code, out = _import(served, "imp-twice")
    assert code == 0, out
    assert "sent 6 batches" in out and "already there" not in out, out
    assert "imported 40 steps (1-40), 120 values of 3 metrics" in out and "project 'nq'" in out, out
    run_id = _run_id(served, "imp-twice")
    first = _points(served, run_id)
    assert {name: len(steps) for name, steps in first.items()} == {
        "grad/norm": 40,
        "lld/logp_pos": 40,
        "reward/mean": 40,
    }
    code, again = _import(served, "imp-twice")
    assert code == 0, again
    assert "sent 0 batches" in again and "(6 already there)" in again, again
    assert "existing run" in again, again
    assert _points(served, run_id) == first


def test_import_over_http_refuses_other_data_without_append(served: Served) -> None:
    assert _import(served, "imp-other")[0] == 0
    other = served.log.with_name("other.csv")
    other.write_text("step,reward/mean\n100,0.5\n")
    code, out = lldmon("import", str(other), "--run", "imp-other", "--format", "csv", *served.remote())
    assert code == 1 and "already has metrics up to step 40" in out and "--append" in out, out
    assert "Traceback" not in out
    code, out = lldmon("import", str(other), "--run", "imp-other", "--replace", *served.remote())
    assert code == 2 and "local only" in out, out


def _json(*args: str) -> Any:
    code, out = lldmon(*args)
    assert code == 0, out
    return json.loads(out)


def test_remote_commands_print_what_their_local_twins_print(served: Served) -> None:
    assert _import(served, "twin")[0] == 0
    run_id = str(_run_id(served, "twin"))
    remote, local = served.remote(), served.local
    for args in (
        ["runs", "list", "--project", "nq", "--json"],
        ["runs", "show", run_id, "--json"],
        ["runs", "show", "twin", "--json"],
        ["alerts", "list", run_id, "--json"],
        ["directive", run_id, "--json"],
    ):
        assert _json(*args, *remote) == _json(*args, *local), args
    live_remote, live_local = (
        _json("runs", "liveness", run_id, "--json", *where) for where in (remote, local)
    )
    live_remote.pop("silent_s"), live_local.pop("silent_s")
    assert live_remote == live_local
    shown = _json("runs", "show", run_id, "--json", *remote)
    assert shown["steps"] == {"count": 40, "first": 1, "last": 40}
    assert shown["metrics"]["grad/norm"]["last_value"] == 1.0
    csv = [lldmon("export", run_id, "-o", "-", *where) for where in (remote, local)]
    assert csv[0] == csv[1] and csv[0][0] == 0 and "inf" in csv[0][1] and "nan" in csv[0][1]


def test_remote_changes_are_what_the_database_then_holds(served: Served) -> None:
    assert _import(served, "levers")[0] == 0
    run_id = str(_run_id(served, "levers"))
    code, out = lldmon(
        "directive",
        run_id,
        "--llds",
        "on",
        "--lambda",
        "0.3",
        "--policy",
        "alert",
        "--reason",
        "by hand",
        *served.remote(),
    )
    assert code == 0 and "policy alert" in out and "LLDS on, lambda 0.3" in out, out
    directive = _json("directive", run_id, "--json", *served.local)
    assert directive["llds"] == {"enabled": True, "lam": 0.3} and directive["reason"] == "by hand"
    code, out = lldmon("runs", "liveness", run_id, "--stall-after", "600", *served.remote())
    assert code == 0 and "stalled after 600 s (set on the run)" in out, out
    assert _json("runs", "liveness", run_id, "--json", *served.local)["stall_after_s"] == 600
    code, out = lldmon("runs", "liveness", run_id, "--stall-after", "-1", *served.remote())
    assert code == 2 and "stall_after_s" in out and "Traceback" not in out, out


def test_a_token_sees_only_its_project(served: Served) -> None:
    code, out = _import(served, "theirs", token=served.other_token)
    assert code == 0 and "project 'other'" in out, out
    listed = _json("runs", "list", "--json", *served.remote())
    assert "theirs" not in {r["name"] for r in listed}
    other_id = next(r["id"] for r in _json("runs", "list", "--json", *served.remote(served.other_token)))
    missing_id = 10_000_000
    for args in (["runs", "show"], ["alerts", "list"], ["directive"], ["runs", "liveness"], ["export"]):
        hidden = lldmon(*args, str(other_id), *(["-o", "-"] if args == ["export"] else []), *served.remote())
        absent = lldmon(
            *args, str(missing_id), *(["-o", "-"] if args == ["export"] else []), *served.remote()
        )
        assert hidden[0] == absent[0] == 1, (args, hidden, absent)
        assert hidden[1].replace(str(other_id), "N") == absent[1].replace(str(missing_id), "N"), args
        assert hidden[1].startswith("error: ") and len(hidden[1].strip().splitlines()) == 1, hidden
    code, out = lldmon("runs", "show", "theirs", *served.remote())
    assert code == 1 and "no run is named 'theirs'" in out, out


def test_remote_errors_are_one_line(served: Served) -> None:
    code, out = lldmon("runs", "list", "--url", served.live.url, "--token", "lldm_wrong")
    assert code == 1 and out.startswith("error: ") and "--token" in out and "Traceback" not in out, out
    code, out = lldmon("runs", "list", "--url", "http://127.0.0.1:9", "--token", served.token)
    assert code == 1 and "cannot reach http://127.0.0.1:9/api/v1" in out, out


def test_token_list_json_never_shows_a_secret(served: Served) -> None:
    tokens = _json("token", "list", "--json", *served.local)
    assert [(t["project"], t["revoked_at"]) for t in tokens[:2]] == [("nq", None), ("other", None)]
    assert all(t["prefix"] and served.token not in json.dumps(t) for t in tokens)


def _normalised(output: str, run: str, run_id: int) -> list[str]:
    """The import summary without what names the run (and without the remote-only `sent` line)."""
    text = output.replace(repr(run), "RUN").replace(f"run {run_id} ", "run N ")
    text = re.sub(r"#\d+ ", "#N ", text)
    return [line for line in text.splitlines() if not line.startswith("sent ")]


def test_import_over_http_prints_the_local_summary(served: Served) -> None:
    code, remote = _import(served, "summary-remote")
    assert code == 0, remote
    args = ["import", str(served.log), "--format", "csv", "--chunk-steps", "7", "--project", "nq"]
    code, local = lldmon(*args, "--run", "summary-local", *served.local)
    assert code == 0, local
    ids = {name: _run_id(served, name) for name in ("summary-remote", "summary-local")}
    assert _normalised(remote, "summary-remote", ids["summary-remote"]) == _normalised(
        local, "summary-local", ids["summary-local"]
    )
    assert (
        _json("runs", "show", str(ids["summary-remote"]), "--json", *served.remote())["metrics"]
        == _json("runs", "show", str(ids["summary-local"]), "--json", *served.local)["metrics"]
    )


def test_alerts_ack_over_http(served: Served) -> None:
    """A silent run goes stalled on the server (sweep every 0.2 s): its alert is acknowledged remotely."""
    registered = httpx.post(
        f"{served.live.api}/runs",
        json={"name": "silent"},
        headers={"authorization": f"Bearer {served.token}"},
    )
    assert registered.status_code == 201, registered.text
    run_id = str(registered.json()["id"])
    code, out = lldmon(
        "runs", "liveness", run_id, "--stall-after", "0.5", "--crash-after", "600", *served.remote()
    )
    assert code == 0, out
    deadline = time.monotonic() + 20
    while not (alerts := _json("alerts", "list", run_id, "--json", *served.remote())):
        assert time.monotonic() < deadline, "no run_stalled alert"
        time.sleep(0.2)
    [alert] = alerts
    assert alert["kind"] == "run_stalled" and alert["status"] == "open"
    code, out = lldmon("alerts", "ack", run_id, str(alert["id"]), *served.remote())
    assert code == 0 and re.fullmatch(rf"alert {alert['id']} \(run_stalled\) acknowledged\n", out), out
    assert [a["status"] for a in _json("alerts", "list", run_id, "--json", *served.local)] == ["acknowledged"]
    missing = [lldmon("alerts", "ack", run_id, "999999", *where) for where in (served.remote(), served.local)]
    assert missing[0] == missing[1] and missing[0][0] == 1 and missing[0][1].startswith("error: "), missing


def test_import_over_http_splits_batches_over_the_body_limit(served: Served, tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    big.write_text(
        "step,reward/mean,lld/logp_pos\n" + "".join(f"{s},{s / 7:.9f},{-s / 3:.9f}\n" for s in range(200))
    )
    assert len(big.read_bytes()) > 2 * BODY_LIMIT
    args = ["import", str(big), "--run", "big", "--format", "csv", "--chunk-steps", "200", *served.remote()]
    code, out = lldmon(*args)
    assert code == 0 and "imported 200 steps (0-199), 400 values" in out, out
    sent = int(re.search(r"sent (\d+) batches", out).group(1))  # type: ignore[union-attr]
    assert sent > 2, out  # one chunk, split into parts under the limit
    code, again = lldmon(*args)
    assert code == 0 and "sent 0 batches" in again and f"({sent} already there)" in again, again
    assert {name: len(steps) for name, steps in _points(served, _run_id(served, "big")).items()} == {
        "lld/logp_pos": 200,
        "reward/mean": 200,
    }
