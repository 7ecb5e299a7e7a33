"""Closed loop end to end: a real TRL run streams to a live `lldmon serve`; the service's directive
flips LLDS on mid-run and the trainer's loss term is zero before and non-zero after."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts import metrics as M
from tests.live_server import LiveServer
from tests.trainer_hooks.test_trl_llds import _trainer_kwargs, one_torch_thread, trl_warnings
from trainer_hooks.client import MonitorClient
from trainer_hooks.trl import MonitoredGRPOTrainer

__all__ = ["one_torch_thread"]  # the module-scoped fixture limits torch to one thread here too

FLIP_AFTER = 2


def flip_directive_callback(server: LiveServer, client: MonitorClient) -> Any:
    from transformers import TrainerCallback

    class Flip(TrainerCallback):  # type: ignore[misc]
        """After optimizer step FLIP_AFTER, a person switches LLDS on through the API."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step != FLIP_AFTER:
                return
            response = httpx.put(
                f"{server.api}/runs/{client.run_id}/directive",
                json={"llds": {"enabled": True, "lam": 0.3}, "reason": "test: phase II"},
            )
            response.raise_for_status()
            # The trainer learns it from the next ingest acknowledgement.
            deadline = time.monotonic() + 20
            while not client.directive.llds.enabled and time.monotonic() < deadline:
                client.log(state.global_step, {"test/heartbeat": 1.0})
                client.flush(5)

    return Flip()


@trl_warnings
@pytest.mark.timeout(180)
def test_service_directive_switches_llds_on_mid_run(tmp_path: Path) -> None:
    with LiveServer(tmp_path / "server").start() as server:
        client = MonitorClient(server.url, "llds-flip", spool_dir=tmp_path / "spool", flush_interval=0.1)
        trainer = MonitoredGRPOTrainer(
            **_trainer_kwargs(tmp_path, max_steps=6), lldmon_sink=client, probe_size=0
        )
        # The client registers the run from its background thread: wait for that, not just the queue.
        client.log(0, {"test/heartbeat": 1.0})
        deadline = time.monotonic() + 30
        while client.run_id is None and time.monotonic() < deadline:
            client.flush(1)
        assert client.run_id is not None
        trainer.add_callback(flip_directive_callback(server, client))
        trainer.train()
        client.close()
        series = server.get(
            f"/runs/{client.run_id}/metrics", names=[M.LLDS_ACTIVE, M.LLDS_LAMBDA, M.LLDS_LOSS]
        )
        directive = server.get(f"/runs/{client.run_id}/directive")

    def by_step(name: str) -> dict[int, Any]:
        s = series["series"].get(name, {"steps": [], "values": []})
        return dict(zip(s["steps"], s["values"], strict=True))

    active, lam, loss = by_step(M.LLDS_ACTIVE), by_step(M.LLDS_LAMBDA), by_step(M.LLDS_LOSS)
    assert directive["llds"] == {"enabled": True, "lam": 0.3} and directive["source"] == "manual"
    # Off up to and including the step at which the directive changed, on from the next optimizer step.
    assert all(active[s] == 0.0 for s in range(1, FLIP_AFTER + 1)), active
    assert all(active[s] == 1.0 for s in range(FLIP_AFTER + 1, 7)), active
    assert all(lam[s] == 0.3 for s in range(FLIP_AFTER + 1, 7))
    # The term: absent (zero) before, computed after, and non-zero on at least one step.
    assert not [s for s in loss if s <= FLIP_AFTER]
    assert sorted(loss) == list(range(FLIP_AFTER + 1, 7))
    assert any(float(v) > 0 for v in loss.values()), loss
