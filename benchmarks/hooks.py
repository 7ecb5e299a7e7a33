"""Overhead of the TRL hooks: wall time per GRPO training step with and without monitoring.

Runs the tiny offline TRL setup of `tests/trainer_hooks/tiny.py` (random 2-layer Qwen2, in-memory BPE
tokenizer, a `search` tool, CPU) in three variants, repetitions interleaved (A B C A B C ...):

- `plain`: `trl.GRPOTrainer`;
- `hooks`: `MonitoredGRPOTrainer` with an in-memory sink, probe and anchor set off (in-loss
  measurement, per-step TRL scalars, name mapping);
- `hooks+probe`: the same with the post-update probe (`--probe-size` rows every `--probe-interval`
  steps; default 8 rows every step, the trainer's default);
- `hooks+anchors`: `hooks` with the anchor set (`--anchor-size` correct responses re-scored every
  `--anchor-interval` steps; default 32 every 5, the trainer's default);
- `defaults`: `MonitoredGRPOTrainer` with nothing but a sink: probe and anchor set at their defaults;
- `client`: `hooks` streaming through the real `MonitorClient` to a live `lldmon serve`;
- `client-down`: the same client pointed at a server that accepts connections and never answers
  (the worst kind of outage: every request hangs until its timeout, then batches go to the spool);
- `hooks+llds`: `hooks` with the LLDS regulariser on (`llds="on"`, lambda 0.2, action gate): the
  term is computed from the loss's own log-probs and backpropagated with it. Its overhead is
  reported against `hooks` (the same trainer with LLDS off) as well.

Step time: the interval between consecutive `on_step_end` events, which covers generation, the
loss, the optimizer and everything the hooks do after the step (measurement, probe, sending).
The configuration drifts (`steps_per_generation=2`: generation every other step), so the per-step
figure of a run is the median over generation cycles of (cycle time / 2). The first cycle of each
run is warm-up and dropped. Figures: median over repetitions of the per-run medians, and the
overhead ratio against `plain`.

Wall-clock differences of a few percent are within the noise of a shared machine, so the script
also times the hook code itself (every monitoring method of MonitoredGRPOTrainer and its
callback, excluding TRL's own work) and reports it as a share of the step: the noise-free figure.

Usage::

    python benchmarks/hooks.py [--reps 5] [--steps 16] [--batch 8] [--probe-size 8] [--probe-interval 1]
                               [--anchor-size 32] [--anchor-interval 5] [--threads 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

from tests.trainer_hooks import tiny  # noqa: E402

VARIANTS = (
    "plain",
    "hooks",
    "hooks+probe",
    "hooks+anchors",
    "defaults",
    "hooks+llds",
    "client",
    "client-down",
)

# Monitoring code paths: methods of MonitoredGRPOTrainer's measurement driver (the probe and the anchor
# set run inside `step_end`; `step_scalars` reads TRL's per-step scalars).
HOOK_METHODS = ("tag_rollout", "collect", "step_end", "step_scalars")
# LLDS code paths of its regulariser driver (the term's forward part; its backward runs inside TRL's
# backward pass).
LLDS_METHODS = ("_term", "tag_rollout", "step_begin", "step_end")


class NullSink:
    """Accepts everything (the real client only enqueues on the training thread too)."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def log_actions(self, step: int, columns: Mapping[str, Sequence[Any]]) -> None:
        pass

    def flush(self, timeout: float) -> None:
        pass

    def close(self) -> None:
        pass


class StepClock(TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(time.perf_counter())


def _timed(fn: Callable[..., Any], bucket: list[float]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket.append(time.perf_counter() - t0)

    return wrapper


def run(
    variant: str,
    steps: int,
    batch: int,
    probe_size: int,
    probe_interval: int,
    workdir: Path,
    urls: Mapping[str, str] | None = None,
    anchor_size: int = 32,
    anchor_interval: int = 5,
) -> tuple[float, float]:
    """One training run; returns (median step time in s, hook seconds per step)."""
    from trl import GRPOTrainer

    from trainer_hooks.trl import MonitoredGRPOTrainer

    tok = tiny.build_tokenizer()
    spg = 2
    config = tiny.grpo_config(
        workdir,
        tok,
        per_device_train_batch_size=batch,
        num_generations=4,
        steps_per_generation=spg,
        max_steps=steps,
        logging_steps=1,
        seed=0,
    )
    clock = StepClock()
    common: dict[str, Any] = {
        "model": tiny.build_model(tok),
        "reward_funcs": tiny.hashed_reward,
        "args": config,
        "train_dataset": tiny.build_dataset(64),
        "processing_class": tok,
        "tools": [tiny.search],
        "callbacks": [clock],
    }
    hook_time: list[float] = []
    if variant == "plain":
        trainer = GRPOTrainer(**common)
    else:
        sink: Any = NullSink()
        if variant.startswith("client"):
            from trainer_hooks.client import MonitorClient

            assert urls is not None
            sink = MonitorClient(urls[variant], workdir.name, spool_dir=workdir / "spool", timeout=2.0)
        options: dict[str, Any] = {
            "probe_size": probe_size if variant == "hooks+probe" else 0,
            "probe_interval": probe_interval,
            "anchor_size": anchor_size if variant == "hooks+anchors" else 0,
            "anchor_interval": anchor_interval,
            "llds": "on" if variant == "hooks+llds" else "off",
        }
        if variant == "defaults":
            options = {"llds": "off"}  # everything else at MonitoredGRPOTrainer's defaults
        trainer = MonitoredGRPOTrainer(**common, lldmon_sink=sink, **options)
        trainer._lldmon_bench_sink = sink
        for name in HOOK_METHODS:
            setattr(
                trainer.lldmon_measurement, name, _timed(getattr(trainer.lldmon_measurement, name), hook_time)
            )
        for name in LLDS_METHODS if variant == "hooks+llds" else ():
            setattr(trainer.llds, name, _timed(getattr(trainer.llds, name), hook_time))
        callback = trainer.lldmon_callback
        callback.send = _timed(callback.send, hook_time)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    if variant.startswith("client"):
        trainer._lldmon_bench_sink.close(timeout=5)  # after the timed steps
    ends = clock.ends
    cycles = [(ends[i + spg] - ends[i]) / spg for i in range(spg - 1, len(ends) - spg, spg)]
    warm = cycles[1:] if len(cycles) > 2 else cycles
    return statistics.median(warm), sum(hook_time) / max(len(ends), 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="per-device micro-batch (completions)")
    parser.add_argument("--probe-size", type=int, default=8)
    parser.add_argument(
        "--probe-interval", type=int, default=1, help="probe every this many steps (trainer default 1)"
    )
    parser.add_argument("--anchor-size", type=int, default=32, help="anchors (trainer default 32)")
    parser.add_argument(
        "--anchor-interval", type=int, default=5, help="re-score anchors every N steps (trainer default 5)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--json", type=Path, help="write the per-variant figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers
    import trl

    transformers.logging.set_verbosity_error()
    print("command:", shlex.join([sys.executable, *sys.argv]))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
        f"{torch.get_num_threads()} threads on {os.cpu_count()} CPUs (load average {load})"
    )
    print(
        f"tiny Qwen2 (hidden 32, 2 layers), tool calling, micro-batch {args.batch}, 4 generations/prompt, "
        f"steps_per_generation 2, {args.steps} steps/run, {args.reps} reps interleaved, "
        f"probe {args.probe_size} rows every {args.probe_interval} step(s), "
        f"anchor set {args.anchor_size} every {args.anchor_interval} step(s)"
    )
    step_s: dict[str, list[float]] = {v: [] for v in VARIANTS}
    hook_s: dict[str, list[float]] = {v: [] for v in VARIANTS}
    from tests.live_server import LiveServer, blackhole

    with tempfile.TemporaryDirectory() as tmp, blackhole() as dead_url:
        server = LiveServer(Path(tmp) / "server").start()
        urls = {"client": server.url, "client-down": dead_url}
        print(f"live server {server.url}; unresponsive server {dead_url}")
        for rep in range(args.reps):
            for variant in VARIANTS:
                med, hooks = run(
                    variant,
                    args.steps,
                    args.batch,
                    args.probe_size,
                    args.probe_interval,
                    Path(tmp) / f"{variant}-{rep}",
                    urls,
                    args.anchor_size,
                    args.anchor_interval,
                )
                step_s[variant].append(med)
                hook_s[variant].append(hooks)
                print(
                    f"  rep {rep} {variant:12s} step {med * 1e3:8.1f} ms   hook code {hooks * 1e3:7.2f} ms/step"
                )
        server.stop()
    base = statistics.median(step_s["plain"])
    print(f"{'variant':12s} {'median step':>12s} {'vs plain':>9s} {'hook code':>10s} {'hook share':>10s}")
    for variant in VARIANTS:
        med = statistics.median(step_s[variant])
        hooks = statistics.median(hook_s[variant])
        print(
            f"{variant:12s} {med * 1e3:9.1f} ms {100 * (med / base - 1):+8.1f}% "
            f"{hooks * 1e3:7.2f} ms {100 * hooks / med:9.2f}%"
        )
    live, down = statistics.median(step_s["client"]), statistics.median(step_s["client-down"])
    print(f"server down vs up (client-down vs client): {100 * (down / live - 1):+.1f}% step time")
    off, on = statistics.median(step_s["hooks"]), statistics.median(step_s["hooks+llds"])
    print(
        f"LLDS on vs off (hooks+llds vs hooks): {100 * (on / off - 1):+.1f}% step time "
        f"({(on - off) * 1e3:+.1f} ms/step)"
    )
    if args.json:
        variants = {}
        for variant in VARIANTS:
            med, hooks = statistics.median(step_s[variant]), statistics.median(hook_s[variant])
            variants[variant] = {
                "step_ms_median": med * 1e3,
                "vs_plain": med / base - 1,
                "hook_ms_per_step": hooks * 1e3,
                "hook_share": hooks / med,
            }
        summary = {
            "command": shlex.join([sys.executable, *sys.argv]),
            "reps": args.reps,
            "steps": args.steps,
            "variants": variants,
            "server_down_vs_up": down / live - 1,
            "llds_on_vs_off": on / off - 1,
            "loadavg": os.getloadavg(),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
