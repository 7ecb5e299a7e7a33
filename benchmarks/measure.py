"""Benchmark `trainer_hooks.likelihood.measure_step` on a Search-R1-sized batch.

Search-R1 trains with 512 prompts x 5 rollouts = 2,560 responses per rollout batch; each response
here has 1,024 tokens with about 3 model actions separated by tool-feedback gaps, then padding.
The vectorised measurement is compared with a naive loop over responses (run on a smaller batch
and scaled linearly to the full batch).

Usage::

    python benchmarks/measure.py [--responses 2560] [--tokens 1024] [--reps 10] [--naive-responses 64]
                                 [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from contracts import metrics as M
from trainer_hooks.likelihood import measure_step


def make_batch(responses: int, tokens: int, seed: int = 0) -> dict[str, Any]:
    """Random Search-R1-like batch: ~3 actions per response, tool feedback between them, padding after."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(responses, tokens, dtype=torch.int64)
    answer = torch.zeros(responses, tokens, dtype=torch.int64)
    # Segment lengths drawn per response: action, feedback, action, feedback, action, padding.
    n_actions = torch.randint(2, 5, (responses,), generator=gen)  # 2..4, mean 3
    act_len = torch.randint(20, 120, (responses, 4), generator=gen)
    gap_len = torch.randint(80, 200, (responses, 3), generator=gen)
    # Build start/end per action with cumulative sums (tensor ops; this is set-up, not timed).
    seg = torch.stack([act_len[:, 0], gap_len[:, 0], act_len[:, 1], gap_len[:, 1], act_len[:, 2]], dim=1)
    seg = torch.cat([seg, gap_len[:, 2:3], act_len[:, 3:4]], dim=1)
    ends = torch.cumsum(seg, dim=1).clamp(max=tokens)
    starts = torch.cat([torch.zeros(responses, 1, dtype=torch.int64), ends[:, :-1]], dim=1)
    pos = torch.arange(tokens)
    for k in range(4):  # 4 possible action slots; a row uses the first n_actions of them
        s, e = starts[:, 2 * k], ends[:, 2 * k]
        on = (pos >= s[:, None]) & (pos < e[:, None]) & (n_actions > k)[:, None]
        mask |= on.to(torch.int64)
        last = (n_actions - 1 == k)[:, None]
        answer |= (on & last & (pos >= (e - 10)[:, None])).to(torch.int64)
    old = -torch.rand(responses, tokens, generator=gen) * 3.0
    new = old + 0.05 * torch.randn(responses, tokens, generator=gen)
    rewards = (torch.rand(responses, generator=gen) < 0.4).to(torch.float32)
    groups = rewards.view(-1, 5) if responses % 5 == 0 else rewards.view(1, -1)
    adv = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).reshape(-1)
    return {
        "old_logp": old,
        "new_logp": new,
        "mask": mask,
        "advantages": adv,
        "rewards": rewards,
        "entropy": torch.rand(responses, tokens, generator=gen) * 2.0,
        "answer_mask": answer,
        "valid_searches": (n_actions - 1).to(torch.float32),
    }


def naive_measure(
    batch: dict[str, Any], eps: float = 0.0, clip_eps: float = 0.2, garbled_ppl: float = 50.0
) -> dict[str, float]:
    """Loop over responses and their actions (per-response tensor ops, `.item()` per value).

    The way a hook is naturally first written; computes the core LLD metrics, ratios, garbled
    share, entropy and the action records, i.e. the bulk of `measure_step`'s work.
    """
    logp_pos = [0.0, 0]
    traj_pos: list[float] = []
    act_pos: list[float] = []
    ratio_sum, ratio_n, ratio_min, ratio_low = 0.0, 0, math.inf, 0
    garbled, ent_sum, ent_n = 0, 0.0, 0
    records: list[tuple[int, int, int, float, float, float]] = []
    for b in range(batch["mask"].shape[0]):
        m = batch["mask"][b] != 0
        idx = m.nonzero().flatten().tolist()
        if not idx:
            continue
        old, new = batch["old_logp"][b], batch["new_logp"][b]
        adv = batch["advantages"][b].item()
        runs: list[list[int]] = [[idx[0]]]
        for t in idx[1:]:
            if t == runs[-1][-1] + 1:
                runs[-1].append(t)
            else:
                runs.append([t])
        d_actions = []
        bad = False
        for k, run in enumerate(runs):
            d = (new[run] - old[run]).sum().item()
            mean_old = old[run].mean().item()
            bad |= math.exp(-mean_old) >= garbled_ppl
            d_actions.append(d)
            records.append((b, k, len(run), d, mean_old, adv))
        garbled += bad
        ent_sum += batch["entropy"][b][m].sum().item()
        ent_n += len(idx)
        if adv > 0:
            logp_pos[0] += old[m].sum().item()
            logp_pos[1] += len(idx)
            traj_pos.append(sum(d_actions))
            act_pos.extend(d_actions)
            r = torch.exp(new[m] - old[m])
            ratio_sum += r.sum().item()
            ratio_n += r.numel()
            ratio_min = min(ratio_min, r.min().item())
            ratio_low += int((r < 1 - clip_eps).sum().item())
    return {
        "logp_pos": logp_pos[0] / max(logp_pos[1], 1),
        "delta_traj_pos": sum(traj_pos) / max(len(traj_pos), 1),
        "delta_action_pos": sum(act_pos) / max(len(act_pos), 1),
        "frac_traj": sum(x < eps for x in traj_pos) / max(len(traj_pos), 1),
        "frac_action": sum(x < eps for x in act_pos) / max(len(act_pos), 1),
        "ratio_mean": ratio_sum / max(ratio_n, 1),
        "ratio_min": ratio_min,
        "ratio_low": ratio_low / max(ratio_n, 1),
        "garbled": garbled / batch["mask"].shape[0],
        "entropy": ent_sum / max(ent_n, 1),
        "records": float(len(records)),
    }


def time_ms(fn: Callable[[], object], reps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def check_agreement(batch: dict[str, Any]) -> None:
    """The figures compare like with like: both implementations give the same numbers."""
    fast = measure_step(**batch)
    slow = naive_measure(batch)
    pairs = {
        M.LOGP_POS: "logp_pos",
        M.DELTA_TRAJ_POS: "delta_traj_pos",
        M.DELTA_ACTION_POS: "delta_action_pos",
        M.FRAC_TRAJ_DECREASED_POS: "frac_traj",
        M.FRAC_ACTION_DECREASED_POS: "frac_action",
        M.RATIO_POS_MEAN: "ratio_mean",
        M.RATIO_POS_MIN: "ratio_min",
        M.RATIO_POS_FRAC_LOW: "ratio_low",
        M.GARBLED_FRAC: "garbled",
        M.ENTROPY_MEAN: "entropy",
    }
    for name, key in pairs.items():
        if not math.isclose(fast.metrics[name], slow[key], rel_tol=1e-4, abs_tol=1e-5):
            raise AssertionError(f"{name}: measure_step {fast.metrics[name]} != naive {slow[key]}")
    if len(fast.actions["delta"]) != slow["records"]:
        raise AssertionError("action record counts differ")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=2560)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--naive-responses", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the timings here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads on {os.cpu_count()} CPUs "
        f"(load average {load}), device cpu, float32"
    )

    batch = make_batch(args.responses, args.tokens)
    n_actions = int((batch["mask"][:, 1:] > batch["mask"][:, :-1]).sum() + batch["mask"][:, 0].sum())
    print(
        f"batch: {args.responses} responses x {args.tokens} tokens, {n_actions} actions "
        f"({n_actions / args.responses:.2f}/response), mask share {batch['mask'].float().mean():.2f}"
    )
    small = make_batch(args.naive_responses, args.tokens, seed=1)
    check_agreement(small)

    fast = time_ms(lambda: measure_step(**batch, group_size=5, step=1), args.reps, args.warmup)
    fast_med = statistics.median(fast)
    print(f"measure_step  full batch:        median {fast_med:8.1f} ms   min {min(fast):8.1f} ms")

    slow = time_ms(lambda: naive_measure(small), max(3, args.reps // 3), 1)
    scale = args.responses / args.naive_responses
    print(
        f"naive loop    {args.naive_responses} responses:     median {statistics.median(slow):8.1f} ms   "
        f"min {min(slow):8.1f} ms"
    )
    slow_med, slow_min = statistics.median(slow) * scale, min(slow) * scale
    print(f"naive loop    scaled x{scale:.0f}:       median {slow_med:8.1f} ms   min {slow_min:8.1f} ms")
    print(f"speed-up (median): x{slow_med / fast_med:.0f}")
    if args.json:
        summary = {
            "command": shlex.join([sys.executable, *sys.argv]),
            "responses": args.responses,
            "tokens": args.tokens,
            "actions": n_actions,
            "threads": torch.get_num_threads(),
            "measure_step_ms_median": fast_med,
            "measure_step_ms_min": min(fast),
            "naive_scaled_ms_median": slow_med,
            "speedup": slow_med / fast_med,
            "loadavg": os.getloadavg(),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
