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

At realistic sizes (`--sizes ROWSxTOKENS,...`, e.g. `64x512,512x1024`) a GRPO step is dominated by
generation, which the hooks never touch, and the variants above would take hours; `--sizes` times the
hooks' parts instead, on the real `MonitoredGRPOTrainer` with a synthetic rollout batch of ROWS
completions of up to TOKENS tokens (half to all of them used, two masked tool outputs each, rewards
1 for 40 %, groups of 4) and a built-in model (`--model`: `tiny`, or `qwen2-150m` on a GPU), on
`--device`. One step = the rollout tagging, TRL's own loss forward/backward over micro-batches of
`--micro-batch` rows, the optimizer step and the hooks' step end: everything but generation, so the
shares are upper bounds of the shares in a real step. Per size, the median over `--scale-steps`
steps after a warm-up step of:
- measurement: rollout tagging, the in-loss capture and `measure_step` over the step's rows;
- probe: re-scoring `--probe-size` rows with the updated model and their exact deltas;
- anchor set: re-scoring `--anchor-size` correct responses (timed at every step, reported per step at
  `--anchor-interval`).
CUDA work is timed between `torch.cuda.synchronize()` calls. `--json` and `--markdown` are rewritten
after every size, so a run stopped early (`--max-seconds`, or killed) keeps the sizes done.

Usage::

    python benchmarks/hooks.py [--reps 5] [--steps 16] [--batch 8] [--probe-size 8] [--probe-interval 1]
                               [--anchor-size 32] [--anchor-interval 5] [--threads 1] [--json PATH]
    python benchmarks/hooks.py --sizes 64x512,128x512,256x1024,512x1024 --model qwen2-150m --device cuda
                               [--micro-batch 16] [--scale-steps 3] [--max-seconds 120]
                               [--json PATH] [--markdown PATH]
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


# --------------------------------------------------------------------------------------------------
# --sizes: the hooks' parts at realistic sizes

GROUP = 4
"""Completions per prompt in the synthetic rollout batch."""


def parse_sizes(text: str, micro_batch: int) -> list[tuple[int, int]]:
    """'64x512,512x1024' -> [(64, 512), (512, 1024)]; rows must be a multiple of the micro-batch and of
    the group size."""
    sizes: list[tuple[int, int]] = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--sizes: {item.strip()!r} is not ROWSxTOKENS (e.g. 64x512)")
        rows, tokens = int(parts[0]), int(parts[1])
        if rows % micro_batch or rows % GROUP:
            raise SystemExit(
                f"--sizes: {rows} rows is not a multiple of --micro-batch {micro_batch} and of {GROUP}"
            )
        sizes.append((rows, tokens))
    return sizes


def synthetic_rollout(
    rows: int, tokens: int, prompt_tokens: int, vocab: int, pad: int, seed: int
) -> tuple[dict[str, Any], torch.Tensor]:
    """A rollout batch as TRL hands it to the loss (CPU tensors) and its rewards (rows x 1)."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.arange(tokens)
    length = torch.randint(tokens // 2, tokens + 1, (rows, 1), generator=gen)
    completion_mask = (pos < length).long()
    completion_ids = torch.randint(vocab, (rows, tokens), generator=gen).masked_fill(
        completion_mask == 0, pad
    )
    gap = max(1, tokens // 8)
    tool_mask = torch.ones(rows, tokens, dtype=torch.long)
    for start in (length // 3, 2 * length // 3):  # two tool outputs: three actions per trajectory
        tool_mask &= ~((pos >= start) & (pos < start + gap))
    rewards = (torch.rand(rows, generator=gen) < 0.4).float()
    groups = rewards.view(-1, GROUP)
    advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
    mask = completion_mask * tool_mask
    batch = {
        "prompt_ids": torch.randint(vocab, (rows, prompt_tokens), generator=gen),
        "prompt_mask": torch.ones(rows, prompt_tokens, dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": advantages,
        "old_per_token_logps": -3.0 * torch.rand(rows, tokens, generator=gen),
        "num_items_in_batch": mask.sum(),
    }
    return batch, rewards[:, None]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed_sync(fn: Callable[..., Any], bucket: list[float], device: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _sync(device)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _sync(device)
            bucket.append(time.perf_counter() - t0)

    return wrapper


def scale_size(
    model: Any,
    tok: Any,
    rows: int,
    tokens: int,
    args: argparse.Namespace,
    device: str,
    bf16: bool,
    workdir: Path,
) -> dict[str, Any]:
    """Time `args.scale_steps` (+1 warm-up) hooked training steps at `rows` x `tokens`; see the module
    docstring. Returns the size's row of the table."""
    from trl import GRPOConfig

    from trainer_hooks.trl import MonitoredGRPOTrainer

    micro = args.micro_batch
    config = GRPOConfig(
        output_dir=str(workdir),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        num_generations=GROUP,
        max_completion_length=tokens,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=device == "cpu",
        bf16=bf16,
        seed=0,
        disable_tqdm=True,
    )
    trainer = MonitoredGRPOTrainer(
        model=model,
        reward_funcs=tiny.hashed_reward,
        args=config,
        train_dataset=tiny.build_dataset(8),
        processing_class=tok,
        lldmon_sink=NullSink(),
        probe_size=args.probe_size,
        anchor_size=args.anchor_size,
        anchor_interval=1,  # timed at every step; reported per step at --anchor-interval
        llds="off",
    )
    measurement = trainer.lldmon_measurement
    assert measurement is not None
    times: dict[str, list[float]] = {k: [] for k in ("measure", "finish", "probe", "step_end")}
    # the measurement's and probe's entry points, wrapped on the instance (step_end calls the others)
    for owner, name, bucket in (
        (measurement, "tag_rollout", "measure"),
        (measurement, "collect", "measure"),
        (measurement.accumulator, "finish", "finish"),
        (measurement, "_run_probe", "probe"),
        (measurement, "step_end", "step_end"),
    ):
        setattr(owner, name, _timed_sync(getattr(owner, name), times[bucket], device))

    batch, rewards = synthetic_rollout(
        rows, tokens, args.prompt_tokens, len(tok), tok.pad_token_id, seed=rows
    )
    target = torch.device(device)
    batch = {k: v.to(target) for k, v in batch.items()}
    rewards = rewards.to(target)
    model = trainer.model
    model.train()
    optimizer = trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = rows // micro
    trainer._rollout_version = -1  # every micro-batch drifted: the in-loss records are measured too
    steps_s: list[float] = []
    marks: list[dict[str, int]] = []
    for step in range(1, args.scale_steps + 2):
        marks.append({k: len(v) for k, v in times.items()})
        _sync(device)
        t0 = time.perf_counter()
        output = dict(batch)
        measurement.tag_rollout(output, rewards)
        for start in range(0, rows, micro):
            part = {k: v[start : start + micro] if v.dim() > 0 else v for k, v in output.items()}
            with trainer.accelerator.autocast():
                loss = trainer._compute_loss(model, part)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trainer.state.global_step = step
        with trainer.accelerator.autocast():
            measurement.step_end(step)
        _sync(device)
        steps_s.append(time.perf_counter() - t0)
    marks.append({k: len(v) for k, v in times.items()})

    def per_step(name: str) -> list[float]:  # seconds of `name` in each step after the warm-up
        return [sum(times[name][marks[i][name] : marks[i + 1][name]]) for i in range(1, len(steps_s))]

    measure = [a + b for a, b in zip(per_step("measure"), per_step("finish"), strict=True)]
    probe = per_step("probe")
    anchors = [e - f - p for e, f, p in zip(per_step("step_end"), per_step("finish"), probe, strict=True)]
    median_step = statistics.median(steps_s[1:])
    anchor_call = statistics.median(anchors)
    anchor = anchor_call / args.anchor_interval
    step_real = median_step - anchor_call + anchor  # the anchor set at its interval, not at every step
    row: dict[str, Any] = {
        "rows": rows,
        "tokens": tokens,
        "probe_rows": measurement.settings.probe_size,
        "anchor_rows": len(measurement.anchors) if measurement.anchors is not None else 0,
        "anchor_interval": args.anchor_interval,
        "step_ms": step_real * 1e3,
        "measure_ms": statistics.median(measure) * 1e3,
        "probe_ms": statistics.median(probe) * 1e3,
        "anchor_ms_per_call": anchor_call * 1e3,
        "anchor_ms_per_step": anchor * 1e3,
    }
    for name in ("measure", "probe"):
        row[f"{name}_share"] = row[f"{name}_ms"] / row["step_ms"]
    row["anchor_share"] = row["anchor_ms_per_step"] / row["step_ms"]
    row["hooks_share"] = row["measure_share"] + row["probe_share"] + row["anchor_share"]
    del trainer, optimizer
    return row


def scale_markdown(summary: Mapping[str, Any]) -> str:
    lines = [
        f"Hooks' cost per GRPO step at realistic sizes: {summary['model']} ({summary['parameters_m']:.0f}M "
        f"parameters) on {summary['device_name']}, {summary['precision']}; prompts of "
        f"{summary['prompt_tokens']} tokens, micro-batches of {summary['micro_batch']} rows; median of "
        f"{summary['scale_steps']} steps after a warm-up step. A step here is everything but generation "
        "(rollout tagging, loss forward/backward, optimizer, the hooks' step end), so the shares are upper "
        "bounds of a real step's.",
        "",
        "| rows | tokens | step (ms) | measurement | probe (rows) | anchor set (rows, every N steps) | hooks total |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary["rows"]:
        if "error" in r:
            lines.append(f"| {r['rows']} | {r['tokens']} | {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['rows']} | {r['tokens']} | {r['step_ms']:.0f} | {r['measure_ms']:.1f} ms "
            f"({r['measure_share']:.1%}) | {r['probe_ms']:.1f} ms ({r['probe_share']:.1%}, {r['probe_rows']}) | "
            f"{r['anchor_ms_per_call']:.1f} ms per call ({r['anchor_share']:.1%}, {r['anchor_rows']}, "
            f"{r['anchor_interval']}) | {r['hooks_share']:.1%} |"
        )
    for size in summary.get("skipped", []):
        lines.append(f"| {size[0]} | {size[1]} | not run (--max-seconds) | | | | |")
    return "\n".join(lines) + "\n"


def scale_main(args: argparse.Namespace) -> None:
    """`--sizes`: the table of the hooks' parts per size (module docstring)."""
    import transformers

    from tests.trainer_hooks.tiny import _example

    transformers.logging.set_verbosity_error()
    started = time.monotonic()
    sizes = parse_sizes(args.sizes, args.micro_batch)
    ex = _example()
    device, bf16 = ex.resolve_device(args.device)
    torch.manual_seed(0)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    tok = ex.build_tiny_tokenizer(ex.load_corpus())
    model = ex.build_builtin_model(args.model, tok, seed=0)
    summary: dict[str, Any] = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "model": args.model,
        "parameters_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "device": device,
        "device_name": name,
        "precision": "bf16 autocast, float32 weights" if bf16 else "float32",
        "prompt_tokens": args.prompt_tokens,
        "micro_batch": args.micro_batch,
        "scale_steps": args.scale_steps,
        "rows": [],
        "skipped": [],
    }
    print(
        f"{args.model}: {summary['parameters_m']:.0f}M parameters on {name}, {summary['precision']}; "
        f"sizes {args.sizes}",
        flush=True,
    )

    def write() -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(summary, indent=2) + "\n")
        if args.markdown:
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(scale_markdown(summary))

    with tempfile.TemporaryDirectory() as tmp:
        for i, (rows, tokens) in enumerate(sizes):
            if args.max_seconds is not None and time.monotonic() - started > args.max_seconds:
                summary["skipped"] = [list(s) for s in sizes[i:]]
                print(f"--max-seconds {args.max_seconds:g} reached: skipped {sizes[i:]}", flush=True)
                break
            t0 = time.monotonic()
            row: dict[str, Any]
            try:
                row = scale_size(model, tok, rows, tokens, args, device, bf16, Path(tmp) / f"{rows}x{tokens}")
            except torch.cuda.OutOfMemoryError:
                row = {"rows": rows, "tokens": tokens, "error": "out of GPU memory"}
            if device == "cuda":
                torch.cuda.empty_cache()
            summary["rows"].append(row)
            write()
            if "error" in row:
                print(f"{rows:4d} x {tokens:5d}: {row['error']}", flush=True)
                continue
            print(
                f"{rows:4d} x {tokens:5d}: step {row['step_ms']:8.1f} ms, measurement {row['measure_share']:6.2%}, "
                f"probe {row['probe_share']:6.2%}, anchor set {row['anchor_share']:6.2%} "
                f"({time.monotonic() - t0:.0f}s)",
                flush=True,
            )
    write()
    print(scale_markdown(summary), end="", flush=True)


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
    scale = parser.add_argument_group("realistic sizes (--sizes; module docstring)")
    scale.add_argument(
        "--sizes", help="ROWSxTOKENS,... (e.g. 64x512,512x1024): time the hooks' parts instead"
    )
    scale.add_argument("--model", default="tiny", help="built-in model of examples/search_r1_grpo.py")
    scale.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    scale.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward")
    scale.add_argument("--prompt-tokens", type=int, default=128)
    scale.add_argument("--scale-steps", type=int, default=3, help="timed steps per size (after a warm-up)")
    scale.add_argument("--max-seconds", type=float, default=None, help="start no size after this long")
    scale.add_argument("--markdown", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.sizes:
        for name in ("micro_batch", "prompt_tokens", "scale_steps", "anchor_interval"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be >= 1")
        scale_main(args)
        return
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
