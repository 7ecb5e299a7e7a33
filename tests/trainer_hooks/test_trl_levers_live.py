"""The levers end to end (issue 15): a real TRL GRPO run (tiny model, CPU) streams to a live
`lldmon serve` (PostgreSQL where the session has it: `trainer_backend`); a person's checkpoint
request makes the Trainer save `checkpoint-<step>` at its next optimizer step, a stop request saves
and ends training early, and each directive version is acknowledged with the metrics of the step that
acted on it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.conftest import live_server_on
from tests.live_server import LiveServer
from tests.trainer_hooks import tiny
from trainer_hooks.client import MonitorClient
from trainer_hooks.trl import MonitoredGRPOTrainer

MAX_STEPS = 8
CHECKPOINT_AFTER = 2  # a person asks for a checkpoint after this optimizer step ...
STOP_AFTER = 4  # ... and for a stop after this one


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def requests_callback(server: LiveServer, client: MonitorClient) -> Any:
    from transformers import TrainerCallback

    class Requester(TrainerCallback):  # type: ignore[misc]
        """Plays the person at the dashboard; waits until the trainer's client has the directive."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            body = {
                CHECKPOINT_AFTER: {"checkpoint": True},
                STOP_AFTER: {"stop": True, "reason": "test: budget"},
            }
            if state.global_step not in body:
                return
            reply = httpx.put(f"{server.api}/runs/{client.run_id}/directive", json=body[state.global_step])
            version = reply.json()["version"]
            deadline = time.monotonic() + 20
            while client.directive.version < version and time.monotonic() < deadline:
                client.log(state.global_step, {"test/heartbeat": 1.0})
                client.flush(5)
            assert client.directive.version == version

    return Requester()


@pytest.mark.filterwarnings(r"ignore:`\w*gradient_checkpointing\w*` is deprecated:FutureWarning")
@pytest.mark.timeout(300)
def test_checkpoint_and_stop_requests_reach_a_real_trl_run(trainer_backend: str, tmp_path: Path) -> None:
    with live_server_on(trainer_backend, tmp_path / "server") as server:
        client = MonitorClient(server.url, "levers", spool_dir=tmp_path / "spool", flush_interval=0.1)
        tok = tiny.build_tokenizer()
        out = tmp_path / "out"
        trainer = MonitoredGRPOTrainer(
            model=tiny.build_model(tok),
            reward_funcs=tiny.hashed_reward,
            args=tiny.grpo_config(out, tok, max_steps=MAX_STEPS),  # save_strategy "no": only on request
            train_dataset=tiny.build_dataset(),
            processing_class=tok,
            tools=[tiny.search],
            lldmon_sink=client,
            probe_size=0,
        )
        client.log(0, {"test/heartbeat": 1.0})
        deadline = time.monotonic() + 30
        while client.run_id is None and time.monotonic() < deadline:
            client.flush(1)
        assert client.run_id is not None
        trainer.add_callback(requests_callback(server, client))
        trainer.train()
        client.close()
        directive = server.get(f"/runs/{client.run_id}/directive")
        history = server.get(f"/runs/{client.run_id}/directives")

    # The checkpoint was saved at the step after the request, and the stop saved and ended training.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        f"checkpoint-{CHECKPOINT_AFTER + 1}",
        f"checkpoint-{STOP_AFTER + 1}",
    ]
    assert (out / f"checkpoint-{CHECKPOINT_AFTER + 1}" / "trainer_state.json").is_file()
    assert trainer.state.global_step == STOP_AFTER + 1 < MAX_STEPS
    # Each version acknowledged with the metrics of the step that acted on it.
    assert directive["applied_version"] == 2 and directive["stop"] == 2 and directive["checkpoint"] == 1
    assert [d["applied_step"] for d in history] == [CHECKPOINT_AFTER + 1, STOP_AFTER + 1]
