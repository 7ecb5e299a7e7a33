"""A real (tiny) TRL GRPO job for the rollback test, run under `lldmon supervise`:
`python -m tests.trainer_hooks.rollback_job URL OUT`.

Checkpoints every 2 steps. In its first attempt it plays the person at the dashboard: after step
`REQUEST_AFTER` it asks the service for a rollback to step `ROLLBACK_TO` with the learning rate halved
and LLDS on (as policy `heal` does), and waits until its client has that directive, so the trainer acts on it at the next step's end. Each
attempt writes the learning rates it logged to `OUT/lr-<attempt>.json`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from tests.trainer_hooks import tiny
from trainer_hooks import rollback
from trainer_hooks.client import MonitorClient
from trainer_hooks.trl import MonitoredGRPOTrainer

MAX_STEPS = 8
REQUEST_AFTER = 5
ROLLBACK_TO = 4
LLDS_LAMBDA = 0.3


def requester(url: str, client: MonitorClient) -> Any:
    from transformers import TrainerCallback

    class Requester(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step != REQUEST_AFTER:
                return
            body = {
                "rollback": {"to_step": ROLLBACK_TO, "lr_scale": 0.5},
                "llds": {"enabled": True, "lam": LLDS_LAMBDA},  # as policy `heal` does
                "reason": "test: roll back",
            }
            reply = httpx.put(f"{url}/api/v1/runs/{client.run_id}/directive", json=body, timeout=30)
            reply.raise_for_status()
            version = reply.json()["version"]
            deadline = time.monotonic() + 60
            while client.directive.version < version and time.monotonic() < deadline:
                client.log(state.global_step, {"test/heartbeat": 1.0})
                client.flush(5)
            assert client.directive.version == version

    return Requester()


def main(url: str, out: Path) -> int:
    torch.set_num_threads(1)
    resumed = rollback.resumed()
    client = MonitorClient(url, "rollback", spool_dir=out / "spool", flush_interval=0.1)
    tok = tiny.build_tokenizer()
    trainer = MonitoredGRPOTrainer(
        model=tiny.build_model(tok),
        reward_funcs=tiny.hashed_reward,
        args=tiny.grpo_config(
            out / "trl", tok, max_steps=MAX_STEPS, save_strategy="steps", save_steps=2, learning_rate=1e-2
        ),
        train_dataset=tiny.build_dataset(),
        processing_class=tok,
        tools=[tiny.search],
        lldmon_sink=client,
        probe_size=0,
    )
    if resumed is None:
        client.log(0, {"test/heartbeat": 1.0})
        deadline = time.monotonic() + 60
        while client.run_id is None and time.monotonic() < deadline:
            client.flush(1)
        trainer.add_callback(requester(url, client))
    trainer.train()
    rolled_back = rollback.requested()
    client.flush(30)
    client.close(status=None if rolled_back else "finished")
    attempt = 2 if resumed is not None else 1
    rates = {
        int(h["step"]): float(h["learning_rate"]) for h in trainer.state.log_history if "learning_rate" in h
    }
    (out / f"lr-{attempt}.json").write_text(json.dumps(rates))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
