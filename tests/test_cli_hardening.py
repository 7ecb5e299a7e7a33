"""Issue 16: `lldmon` input errors (#13), `serve` binding before it announces (#13), slow clients (#15),
a command whose extra is not installed (#16). `serve` runs as a real process, as a user starts it."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from monitor.cli import app
from tests.without_extras import lldmon_without

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
EXE = shutil.which("lldmon") or str(Path(sys.executable).parent / "lldmon")


def _one_error(output: str) -> str:
    """The error of a usage failure: one line (Click's, in Typer's frame), never a traceback."""
    assert "Traceback" not in output and "─ locals ─" not in output, output
    lines = [line.strip(" │") for line in output.splitlines() if "Invalid value" in line or "error:" in line]
    assert len(lines) == 1, output
    return lines[0]


@pytest.fixture
def seeded(db_url: str, tmp_path: Path) -> dict[str, Any]:
    from monitor.api.app import build_state
    from monitor.config import Settings
    from monitor.domain import Principal

    state = build_state(Settings(database_url=db_url, data_dir=tmp_path))
    run, _ = state.runs.register(Principal(), "grpo", "nq", {}, [])
    state.db.dispose()
    return {"url": db_url, "run_id": run.id}


def cli(seeded: dict[str, Any], *args: str) -> Any:
    return runner.invoke(app, [*args, "--database-url", seeded["url"]], env=WIDE)


def test_enumerated_options_are_checked(seeded: dict[str, Any]) -> None:
    """`runs list --status runing` was a 27-line traceback, `alerts list --status opn` an empty table."""
    run = str(seeded["run_id"])
    cases = [
        (["runs", "list", "--status", "runing"], "runing", ["running", "finished", "failed", "crashed"]),
        (["alerts", "list", run, "--status", "opn"], "opn", ["open", "acknowledged", "resolved"]),
        (["directive", run, "--policy", "always"], "always", ["off", "alert", "auto"]),
        (["directive", run, "--llds", "yes"], "yes", ["on", "off"]),
    ]
    for args, bad, choices in cases:
        result = cli(seeded, *args)
        assert result.exit_code == 2, (args, result.output)
        error = _one_error(result.output)
        assert f"'{bad}'" in error and all(f"'{c}'" in error for c in choices), error
    assert "grpo" in cli(seeded, "runs", "list", "--status", "running").output
    ok = cli(seeded, "alerts", "list", run, "--status", "open")
    assert ok.exit_code == 0, ok.output
    policy = cli(seeded, "directive", run, "--policy", "auto")
    assert policy.exit_code == 0 and "policy auto" in policy.output


def test_numeric_options_are_bounded(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path)]
    for args in (
        ["serve", "--port", "80800", *data],
        ["serve", "--port", "-1", *data],
        ["serve", "--workers", "0", *data],
        ["import", "x.log", "--run", "r", "--chunk-steps", "0", *data],
    ):
        result = runner.invoke(app, args, env=WIDE)
        assert result.exit_code == 2, (args, result.output)
        _one_error(result.output)
    assert not (tmp_path / "lldmon.db").exists()  # refused before anything was opened


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LLDMON_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "200"}
    env.pop("LLDMON_DATABASE_URL", None)
    return subprocess.Popen(
        [EXE, "serve", "--host", "127.0.0.1", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        output = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        output = proc.communicate()[0]
        raise AssertionError(f"still serving after {timeout}s:\n{output}") from None
    return proc.returncode, output


def test_serve_on_a_busy_port_fails_before_announcing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, output = _finish(_serve(tmp_path, "--port", str(port)))
    assert code == 2, output
    assert "serving on" not in output, output
    error = _one_error(output)
    assert f"127.0.0.1:{port}" in error and "in use" in error, error


def test_serve_out_of_range_port_is_refused(tmp_path: Path) -> None:
    """--port 80800 was announced, and uvicorn listened on 80800 % 65536."""
    code, output = _finish(_serve(tmp_path, "--port", "80800"))
    assert code == 2 and "serving on" not in output, output
    assert "--port" in _one_error(output) and "65535" in _one_error(output)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`lldmon serve --port 0 --timeout-request 1`: the announced URL must be the one it listens on."""
    proc = _serve(tmp_path, "--port", "0", "--timeout-request", "1")
    assert proc.stdout is not None
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            found = re.search(r"serving on (http://127\.0\.0\.1:(\d+))", line)
            if found:
                break
        else:
            raise AssertionError("".join(lines))
        assert found.group(2) != "0"
        base = found.group(1)
        # announced after the bind: the first request is served, not refused
        assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200
        yield base, proc
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed `sock` within `seconds` (and what it sent before)."""
    sock.settimeout(0.2)
    received = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, received
        if not chunk:
            return True, received
        received += chunk
    return False, received


def test_incomplete_requests_are_timed_out(server: tuple[str, subprocess.Popen[str]]) -> None:
    """A client that never completes its request no longer holds a connection: silent, half a head, a
    head trickled byte by byte, a stalled body; a complete request on a kept-alive connection is served."""
    base, _ = server
    host, port = base.removeprefix("http://").split(":")
    address = (host, int(port))
    silent = [socket.create_connection(address) for _ in range(20)]
    half = socket.create_connection(address)
    half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    stalled = socket.create_connection(address)
    stalled.sendall(
        b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b'content-length: 100\r\n\r\n{"name": '
    )
    trickle = socket.create_connection(address)
    started = time.monotonic()
    try:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.25 s: never idle for 1 s
            trickle.sendall(bytes([byte]))
            time.sleep(0.25)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert _closed_within(trickle, 3)[0]
    assert time.monotonic() - started < 5  # the head's deadline (1 s) was not reset by each byte
    closed_half, sent_half = _closed_within(half, 3)
    assert closed_half and sent_half.startswith(b"HTTP/1.1 408"), sent_half
    assert _closed_within(stalled, 3)[0]
    assert all(_closed_within(s, 3)[0] for s in silent)
    for s in [*silent, half, stalled, trickle]:
        s.close()

    with httpx.Client(base_url=base, timeout=10) as client:  # keep-alive between requests still works
        assert client.get("/healthz").status_code == 200
        time.sleep(1.5)  # idle longer than the request timeout, shorter than the keep-alive one
        assert client.get("/healthz").status_code == 200

    # A slow but steady body is not cut: each pause is shorter than the timeout, the whole upload longer.
    body = b'{"name": "slow-upload", "config": {"note": "' + b"x" * 400 + b'"}}'
    with socket.create_connection(address) as upload:
        upload.sendall(
            b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        for i in range(0, len(body), len(body) // 4 + 1):
            upload.sendall(body[i : i + len(body) // 4 + 1])
            time.sleep(0.5)
        closed, answer = _closed_within(upload, 5)
    assert closed and answer.startswith(b"HTTP/1.1 201"), answer


def test_choices_match_the_contract() -> None:
    from typing import get_args

    from contracts.wire import DIRECTIVE_POLICIES, RUN_STATUSES
    from monitor.cli import AlertStatus, Policy, RunStatus

    assert get_args(RunStatus) == RUN_STATUSES and get_args(Policy) == DIRECTIVE_POLICIES
    assert get_args(AlertStatus) == ("open", "acknowledged", "resolved")


SERVER_EXTRA = (
    "fastapi,fastapi_offline,uvicorn,sqlalchemy,alembic,pydantic,pydantic_settings,msgspec,orjson,numpy,"
    "pandas,pyarrow,plotly,dash,prometheus_client,a2wsgi,tensorboard,psycopg,torch,transformers,trl,bm25s"
)


@pytest.mark.parametrize(
    "args",
    [
        ["export", "1", "-o", "-"],
        ["runs", "list"],
        ["serve", "--port", "0"],
        ["db", "upgrade"],
        ["import", "run.jsonl", "--run", "r"],
        ["eval"],
    ],
)
def test_a_command_without_its_extra_names_it(tmp_path: Path, args: list[str]) -> None:
    """In an install without extras (`pip install lldmon`) `lldmon export` ended in
    `ModuleNotFoundError: sqlalchemy` (a traceback); now one line says which extra to install."""
    result = lldmon_without(SERVER_EXTRA, *args, data_dir=tmp_path, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    [line] = output.strip().splitlines()
    command = " ".join(args[:2] if args[0] in ("runs", "db") else args[:1])
    assert line.startswith(f"error: lldmon {command} needs lldmon's server extra"), line
    assert "pip install 'lldmon[server] @ " in line, line
    assert not list(tmp_path.iterdir())  # nothing was created


def test_help_needs_no_extra() -> None:
    result = lldmon_without(SERVER_EXTRA, "--help")
    assert result.returncode == 0 and "import" in result.stdout, result.stdout + result.stderr
