"""kill -9 of the API process mid-stream, restart on the same database: the acknowledgement property.

Every batch the client got a 2xx acknowledgement for is stored; every other batch is re-sent (live
retry or spool replay) until acknowledged; nothing is stored twice. Strengthens
tests/trainer_hooks/test_client.py::test_server_killed_mid_run_and_restarted_every_step_once by
recording the acknowledgements at the transport and by forcing the worst case deterministically: a
batch committed by the server whose acknowledgement never reaches the client (the server is killed
between commit and answer). Meanwhile the training loop keeps logging, so later batches meet the dead
server (retries, then the spool). A kill at a random point of a request is the existing test's."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from contracts import spool
from tests.faults.delivery import ledger_batches, wait_until_delivered
from tests.live_server import LiveServer
from tests.trainer_hooks.conftest import FAST
from tests.trainer_hooks.test_client import assert_stored_exactly_once, expected_points, metrics_at
from trainer_hooks.client import MonitorClient

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]


class AckRecorder(httpx.BaseTransport):
    """The real transport, recording per metrics batch id what the client sent and what came back.

    `lose_next_ack(action)`: the next metrics batch the server acknowledges is stored there, then
    `action()` runs (kill -9) and the client gets a connection error instead of the answer.
    """

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.lock = threading.Lock()
        self.sent: Counter[str] = Counter()  # batch id -> requests
        self.acked: dict[str, list[bool]] = {}  # batch id -> "duplicate" flag of each 2xx answer seen
        self.lost: list[str] = []
        self.ack_lost = threading.Event()  # set once the kill has happened and the answer is dropped
        self._lose: object | None = None

    def lose_next_ack(self, action: object) -> None:
        self._lose = action

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not (request.method == "POST" and request.url.path.endswith("/metrics")):
            return self.inner.handle_request(request)
        batch_id = json.loads(gzip.decompress(request.read()))["batch_id"]
        with self.lock:
            self.sent[batch_id] += 1
        response = self.inner.handle_request(request)
        response.read()
        if response.is_success:
            lose, self._lose = self._lose, None
            if callable(lose):
                lose()  # the batch is committed, the server dies before the client reads the answer
                with self.lock:
                    self.lost.append(batch_id)
                self.ack_lost.set()
                raise httpx.ReadError("connection reset (server killed)", request=request)
            with self.lock:
                self.acked.setdefault(batch_id, []).append(bool(response.json()["duplicate"]))
        return response

    def close(self) -> None:
        self.inner.close()


def test_kill_9_mid_stream_every_acknowledged_batch_stored_every_other_resent_none_twice(
    tmp_path: Path,
) -> None:
    recorder = AckRecorder()
    steps = range(300)
    with LiveServer(tmp_path / "server").start() as server:
        client = MonitorClient(
            server.url,
            "kill9",
            spool_dir=tmp_path / "spool",
            transport=recorder,
            retry=FAST,
            flush_interval=0.02,
            max_batch_rows=10,
            timeout=5.0,
            enabled=True,
        )
        try:
            for step in steps:
                client.log(step, metrics_at(step))
                time.sleep(0.002)
                if step == 80:
                    recorder.lose_next_ack(server.kill)  # committed, then kill -9, answer lost
                if step == 140:
                    # The sender delivers on its own schedule and kill -9 takes its time under load:
                    # wait for the fault to have happened instead of assuming 60 steps were enough.
                    assert recorder.ack_lost.wait(30), "the lost acknowledgement did not happen"
                    server.start()  # same port, same database
            wait_until_delivered(client, timeout=40)
        finally:
            client.close(timeout=15)

        run_id = assert_stored_exactly_once(server, "kill9", steps)  # values; ledger rows once
        ledger = ledger_batches(server, run_id)

    sent, acked, lost = set(recorder.sent), recorder.acked, recorder.lost
    assert len(lost) == 1 and client.stats.spooled > 0  # both fault paths really happened
    assert set(acked) <= set(ledger), "an acknowledged batch is not stored"
    assert set(ledger) == sent == set(acked), "every batch sent was stored and finally acknowledged"
    # The batch whose answer was lost was stored by the first delivery and re-sent: the re-send got
    # "duplicate", so its rows count once. No other batch was acknowledged as new twice.
    assert acked[lost[0]] == [True] and recorder.sent[lost[0]] >= 2
    assert all(flags.count(False) == 1 for batch, flags in acked.items() if batch != lost[0])
    assert sum(ledger.values()) == expected_points(steps)
    assert client.stats.duplicates >= 1 and spool.spool_size(client.spool_dir) == (0, 0)
