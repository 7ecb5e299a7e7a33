"""The hint a closing client logs for what stays in its spool is a command that works as printed: against
a server that requires auth it carries `--token`, naming the variable rather than the secret."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from tests.live_server import free_port
from trainer_hooks.client import MonitorClient, RetryPolicy


def _hint(client: MonitorClient, caplog: pytest.LogCaptureFixture) -> str:
    for step in range(20):
        client.log(step, {"a": float(step)})
    client.close(timeout=5)
    said = [r.getMessage() for r in caplog.records if "stay in the spool" in r.getMessage()]
    assert len(said) == 1, said
    return said[0]


def _client(url: str, spool_dir: Path, **kwargs: object) -> MonitorClient:
    return MonitorClient(
        url,
        "left",
        spool_dir=spool_dir,
        max_batch_rows=10,
        flush_interval=0.02,
        retry=RetryPolicy(attempts=1, backoff_base=0.01, backoff_max=10.0),
        enabled=True,
        **kwargs,  # type: ignore[arg-type]
    )


def test_hint_has_token_when_the_server_refused_the_client_without_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lldmon.client")

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"detail": "missing or invalid token", "code": "unauthorized"})

    client = _client("http://lldmon.test", tmp_path / "spool", transport=httpx.MockTransport(refuse))
    hint = _hint(client, caplog)
    assert f"`lldmon sync {client.spool_dir} --url http://lldmon.test --token $LLDMON_TOKEN`" in hint


def test_hint_names_the_token_variable_never_the_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lldmon.client")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listening
    client = _client(url, tmp_path / "spool", token="lldm_secret_value")
    hint = _hint(client, caplog)
    assert f"`lldmon sync {client.spool_dir} --url {url} --token $LLDMON_TOKEN`" in hint
    assert "lldm_secret_value" not in hint


def test_hint_without_auth_has_no_token(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="lldmon.client")
    url = f"http://127.0.0.1:{free_port()}"
    client = _client(url, tmp_path / "spool")
    assert f"`lldmon sync {client.spool_dir} --url {url}`" in _hint(client, caplog)
