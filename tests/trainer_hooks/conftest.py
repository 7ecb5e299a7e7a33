"""What the client tests share: fast retries and a client factory that closes every client."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer_hooks.client import MonitorClient, RetryPolicy

FAST = RetryPolicy(attempts=3, backoff_base=0.02, backoff_max=0.3, max_retry_after=5.0)


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[Callable[..., MonitorClient]]:
    """MonitorClient factory with test defaults; every client is closed at teardown."""
    clients: list[MonitorClient] = []

    def make(url: str, run_name: str, **kwargs: Any) -> MonitorClient:
        kwargs.setdefault("spool_dir", tmp_path / "spool" / run_name)
        kwargs.setdefault("flush_interval", 0.05)
        kwargs.setdefault("retry", FAST)
        kwargs.setdefault("timeout", 10.0)
        kwargs.setdefault("enabled", True)
        client = MonitorClient(url, run_name, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close(timeout=5)
    assert not [t for t in threading.enumerate() if t.name == "lldmon-sender"], "close() leaves no thread"
