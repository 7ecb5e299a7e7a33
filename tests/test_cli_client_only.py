"""The client install (`lldmon[cli]`: numpy and pydantic, no FastAPI, SQLAlchemy or Dash) against a real
`lldmon serve` on SQLite: every command with --url, `sync` and `watch` run in a child process where the
packages of the other extras cannot be imported, and read or write the data asked for; the local
commands name the server extra in one line. The base install (no extra) syncs a spool and names the
`cli` extra for what needs numpy. And the remote path loads no server package even where one is
installed."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

from contracts import spool
from contracts.spool import RunIdentity, SpoolEntry
from tests.conftest import live_server_on
from tests.live_server import LiveServer
from tests.without_extras import lldmon_without

ROOT = Path(__file__).resolve().parents[1]
TEST_EXTRAS = ("dev", "verl-test")


def _modules_of_extras() -> dict[str, set[str]]:
    """extra -> the top-level modules of its distributions (`prometheus-client` -> `prometheus_client`),
    from lldmon's installed metadata."""
    out: dict[str, set[str]] = {}
    for text in importlib.metadata.requires("lldmon") or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.name == "lldmon":
            continue
        for extra in importlib.metadata.metadata("lldmon").get_all("Provides-Extra") or []:
            if extra not in TEST_EXTRAS and requirement.marker.evaluate({"extra": extra}):
                out.setdefault(extra, set()).add(requirement.name.replace("-", "_").lower())
    return out


EXTRAS = _modules_of_extras()
CLIENT = EXTRAS["cli"]
NOT_IN_CLIENT = ",".join(
    sorted(set().union(*EXTRAS.values()) - CLIENT | {"starlette"})  # starlette: FastAPI's, undeclared
)
"""What a laptop with `lldmon[cli]` lacks: the server, postgres, formats and hooks extras' packages."""
BASE = ",".join(sorted({*NOT_IN_CLIENT.split(","), *CLIENT} - {"pydantic"}))
"""What `pip install lldmon` lacks. pydantic stays: typer itself requires it."""


@pytest.fixture(autouse=True)
def _no_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLDMON_URL", raising=False)
    monkeypatch.delenv("LLDMON_TOKEN", raising=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server_on("sqlite", tmp_path_factory.mktemp("client-only")) as live:
        yield live


def client(server: LiveServer, *args: str, cwd: Path, blocked: str = NOT_IN_CLIENT) -> str:
    """`lldmon ARGS --url SERVER` in a client install: its stdout, after asserting it succeeded."""
    result = lldmon_without(blocked, *args, "--url", server.url, cwd=cwd)
    output = result.stdout + result.stderr
    assert result.returncode == 0, (args, output)
    assert "Traceback" not in output, output
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    [line] = output.strip().splitlines()
    assert line.startswith("error: "), line
    return line


def test_import_over_http_then_read_it_back(server: LiveServer, tmp_path: Path) -> None:
    """verl JSONL (gzip) and CSV are parsed on the laptop and sent; listing, the summary and the export
    over --url show exactly what was sent."""
    verl = tmp_path / "verl.jsonl.gz"
    verl.write_bytes(
        gzip.compress(
            b"".join(
                json.dumps({"step": s, "actor/entropy": 2.0 - s / 10, "actor/grad_norm": v}).encode() + b"\n"
                for s, v in ((1, 0.5), (2, math.inf), (3, 0.25))
            )
        )
    )
    table = tmp_path / "metrics.csv"
    table.write_text("step,reward/mean\n0,0.125\n5,0.5\n")

    out = client(server, "import", str(verl), "--run", "c-verl", "--project", "laptop", cwd=tmp_path)
    assert "imported 3 steps (1-3)" in out and "from 1 verl-jsonl file(s)" in out, out
    out = client(server, "import", str(table), "--run", "c-csv", "--format", "csv", cwd=tmp_path)
    assert "imported 2 steps (0-5)" in out, out
    again = client(server, "import", str(verl), "--run", "c-verl", "--project", "laptop", cwd=tmp_path)
    assert "sent 0 batches" in again and "(1 already there)" in again, again  # idempotent

    listed = {r["name"]: r for r in json.loads(client(server, "runs", "list", "--json", cwd=tmp_path))}
    assert listed["c-verl"]["project"] == "laptop" and listed["c-verl"]["last_step"] == 3
    assert listed["c-csv"]["status"] == "finished" and listed["c-csv"]["last_step"] == 5
    assert "c-verl" in client(server, "runs", "list", "--project", "laptop", cwd=tmp_path)

    shown = json.loads(client(server, "runs", "show", "c-verl", "--json", cwd=tmp_path))
    assert shown["steps"] == {"count": 3, "first": 1, "last": 3}
    assert shown["metrics"]["grad/norm"]["last_value"] == 0.25
    assert "3 steps logged (steps 1-3)" in client(server, "runs", "show", "c-verl", cwd=tmp_path)

    written = tmp_path / "verl.csv"
    out = client(server, "export", "c-verl", "-o", str(written), cwd=tmp_path)
    assert "3 steps x 2 metrics (csv)" in out, out
    assert written.read_text() == "step,entropy/mean,grad/norm\n1,1.9,0.5\n2,1.8,inf\n3,1.7,0.25\n"
    piped = client(server, "export", "c-csv", "-m", "reward/mean", "-o", "-", cwd=tmp_path)
    assert piped == "step,reward/mean\n0,0.125\n5,0.5\n"


def test_runs_alerts_and_directive_over_http(server: LiveServer, tmp_path: Path) -> None:
    registered = httpx.post(f"{server.api}/runs", json={"name": "c-steer"}, timeout=10)
    assert registered.status_code == 201, registered.text
    run_id = registered.json()["id"]

    changed = json.loads(
        client(server, "directive", "c-steer", "--llds", "on", "--lambda", "0.3", "--json", cwd=tmp_path)
    )
    assert changed["llds"] == {"enabled": True, "lam": 0.3}
    assert server.get(f"/runs/{run_id}/directive")["llds"] == {"enabled": True, "lam": 0.3}
    assert "LLDS on, lambda 0.3" in client(server, "directive", "c-steer", cwd=tmp_path)

    live = json.loads(
        client(server, "runs", "liveness", "c-steer", "--stall-after", "600", "--json", cwd=tmp_path)
    )
    assert live["stall_after_s"] == 600 and server.get(f"/runs/{run_id}/liveness")["stall_after_s"] == 600

    assert json.loads(client(server, "alerts", "list", "c-steer", "--json", cwd=tmp_path)) == []
    missing = lldmon_without(NOT_IN_CLIENT, "alerts", "ack", "c-steer", "9999", "--url", server.url)
    assert one_line_error(missing) == f"error: run {run_id} has no alert 9999"


def test_export_actions_over_http(server: LiveServer, tmp_path: Path) -> None:
    run_id = httpx.post(f"{server.api}/runs", json={"name": "c-actions"}, timeout=10).json()["id"]
    batch = {
        "batch_id": "c-actions-1",
        "step": [4, 4, 7],
        "source": ["loss", "loss", "probe"],
        "traj_index": [0, 1, 0],
        "action_index": [0, 0, 2],
        "n_tokens": [12, 30, 7],
        "delta": [-0.5, "NaN", 0.25],
        "old_logp_mean": [-1.0, -2.0, "-Infinity"],
        "advantage": [1.0, -1.0, 0.0],
        "reward": [1.0, 0.0, "Infinity"],
        "is_answer": [True, False, False],
    }
    sent = httpx.post(f"{server.api}/runs/{run_id}/actions", json=batch, timeout=10)
    assert sent.status_code == 200, sent.text

    lines = client(server, "export", "c-actions", "--actions", "-f", "jsonl", "-o", "-", cwd=tmp_path)
    assert [json.loads(line) for line in lines.splitlines()] == [
        {name: batch[name][i] for name in batch if name != "batch_id"} for i in range(3)
    ]
    written = tmp_path / "actions.csv"
    out = client(server, "export", "c-actions", "--actions", "-o", str(written), cwd=tmp_path)
    assert "3 action records over 2 steps (csv)" in out, out
    assert written.read_text().splitlines()[1:] == [
        "4,loss,0,0,12,-0.5,-1.0,1.0,1.0,true",
        "4,loss,1,0,30,nan,-2.0,-1.0,0.0,false",
        "7,probe,0,2,7,0.25,-inf,0.0,inf,false",
    ]


def test_sync_and_watch_over_http(server: LiveServer, tmp_path: Path) -> None:
    spooled = tmp_path / "spool"
    body = {"batch_id": "c-sync-1", "steps": [0, 1], "metrics": {"loss": [1.0, "NaN"]}}
    spool.write_entry(spooled, SpoolEntry(run=RunIdentity("c-sync", "laptop"), kind="metrics", body=body))
    out = client(server, "sync", str(spooled), cwd=tmp_path)
    assert "sent 1, duplicates 0, rejected 0, remaining 0" in out, out
    assert server.series(server.run_id("c-sync", "laptop"))["loss"] == {
        "steps": [0, 1],
        "values": [1.0, "NaN"],
    }

    log = tmp_path / "train.jsonl"
    log.write_text("".join(json.dumps({"step": s, "actor/grad_norm": s / 4}) + "\n" for s in range(3)))
    out = client(
        server,
        "watch",
        str(log),
        "--run",
        "c-watch",
        "--from-start",
        "--until-idle",
        "0.5",
        "--state-dir",
        str(tmp_path / "state"),
        cwd=tmp_path,
    )
    assert "sent 3 steps" in out, out
    assert server.series(server.run_id("c-watch"))["grad/norm"] == {
        "steps": [0, 1, 2],
        "values": [0.0, 0.25, 0.5],
    }


def test_the_base_install_syncs_and_names_the_cli_extra_for_the_rest(
    server: LiveServer, tmp_path: Path
) -> None:
    """`pip install lldmon` (the trainer's side) uploads a spool and lists runs; what parses logs or
    writes exports (numpy) names the cli extra, before anything is sent."""
    spooled = tmp_path / "spool"
    body = {"batch_id": "c-base-1", "steps": [3], "metrics": {"loss": [0.5]}}
    spool.write_entry(spooled, SpoolEntry(run=RunIdentity("c-base", "laptop"), kind="metrics", body=body))
    out = client(server, "sync", str(spooled), cwd=tmp_path, blocked=BASE)
    assert "sent 1, duplicates 0, rejected 0, remaining 0" in out, out
    assert "c-base" in client(server, "runs", "list", "--project", "laptop", cwd=tmp_path, blocked=BASE)

    log = tmp_path / "m.csv"
    log.write_text("step,loss\n1,0.5\n")
    for args in (["import", str(log), "--run", "c-base-import"], ["export", "c-base"]):
        line = one_line_error(lldmon_without(BASE, *args, "--url", server.url, cwd=tmp_path))
        assert line.startswith(f"error: lldmon {args[0]} needs lldmon's cli extra ('numpy' is not installed)")
        assert "pip install 'lldmon[cli] @ " in line, line
    assert "c-base-import" not in [r["name"] for r in server.get("/runs", limit=1000)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "spool"]  # no export file


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--port", "0"],
        ["db", "current"],
        ["token", "list"],
        ["auth", "status"],
        ["runs", "list"],
        ["export", "1", "-o", "-"],
        ["import", "m.csv", "--run", "r"],
    ],
)
def test_local_commands_name_the_server_extra(tmp_path: Path, args: list[str]) -> None:
    """Without --url a command works on the database: in the client install one line names the server
    extra, before any work (the import parses nothing, no data directory is created)."""
    (tmp_path / "m.csv").write_text("step,loss\n1,0.5\n")
    result = lldmon_without(NOT_IN_CLIENT, *args, data_dir=tmp_path / "data", cwd=tmp_path)
    line = one_line_error(result)
    command = " ".join(args[:2] if args[0] in ("runs", "db", "token", "auth") else args[:1])
    assert line.startswith(f"error: lldmon {command} needs lldmon's server extra"), line
    assert "pip install 'lldmon[server] @ " in line, line
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]


SERVER_PACKAGES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "dash",
    "plotly",
    "pandas",
    "pydantic_settings",
    "msgspec",
    "orjson",
    "prometheus_client",
    "psycopg",
)
SERVER_MODULES = (
    "dashboard",
    "monitor.api.app",
    "monitor.bootstrap",
    "monitor.config",
    "monitor.db",
    "monitor.services.query",
    "monitor.store",
)

IN_PROCESS = """
import json, sys
from monitor.cli import app
for args in json.loads(sys.argv[1]):
    try:
        app(args, standalone_mode=False)
    except SystemExit as exc:
        assert not exc.code, (args, exc.code)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_remote_path_loads_no_server_package(server: LiveServer, tmp_path: Path) -> None:
    """In the full install too: the commands over --url import neither the server's packages nor its
    own modules (the database, its settings, the app), only the API's response schemas."""
    log = tmp_path / "m.csv"
    log.write_text("step,loss\n1,0.5\n2,0.25\n")
    spooled = tmp_path / "spool"
    body = {"batch_id": "c-modules-1", "steps": [0], "metrics": {"loss": [1.0]}}
    spool.write_entry(spooled, SpoolEntry(run=RunIdentity("c-modules", "laptop"), kind="metrics", body=body))
    url = ["--url", server.url]
    commands = [
        ["import", str(log), "--run", "c-loaded", *url],
        ["runs", "list", "--json", *url],
        ["runs", "show", "c-loaded", "--json", *url],
        ["runs", "liveness", "c-loaded", "--json", *url],
        ["alerts", "list", "c-loaded", "--json", *url],
        ["directive", "c-loaded", "--json", *url],
        ["export", "c-loaded", "-o", str(tmp_path / "out.csv"), *url],
        ["export", "c-loaded", "--actions", "-o", str(tmp_path / "out.jsonl"), *url],
        ["sync", str(spooled), *url],
    ]
    done = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, json.dumps(commands)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert (tmp_path / "out.csv").read_text() == "step,loss\n1,0.5\n2,0.25\n"
    assert "monitor.cli.remote" in loaded and "monitor.api.schemas" in loaded
    assert {m.partition(".")[0] for m in loaded} & set(SERVER_PACKAGES) == set()
    assert sorted(m for m in loaded if m.startswith(SERVER_MODULES)) == []
