"""The GPU lab in one command: a ~150M-parameter policy trained with GRPO and the hooks (LLDS off and
`auto`, one seed each) against `lldmon serve` on SQLite, and the hooks' cost at realistic sizes, on a
machine that has only Python, PyTorch and transformers (`scripts/gpu-lab.sh`, examples/README.md).

    python -m lldmon_lab.gpu_lab --out OUT [--size gpu|tiny] [--wheels DIR] [--device cuda|cpu|auto]

Phases, each timed and printed as it goes, under one time budget (`--budget-s`; 540 s for `gpu`): a
phase gets a hard guard from what is left, and what it has when its guard fires is still written.
1. install (`--wheels DIR`): the wheels of scripts/gpu-lab-requirements.txt, offline
   (`lldmon_lab.gpu_wheels`), then an import check of everything the lab runs. lldmon itself runs from
   the working tree (PYTHONPATH): an installed lldmon registers the dashboard, whose packages are
   left out of the wheels to fit the carry budget. Where `datasets` is absent, scripts/gpu-lab-shim
   stands in for it and for pyarrow (its README says why that is enough for TRL's GRPO).
2. preflight: torch, CUDA and the card, in a subprocess (lldmon_lab never imports torch).
3. overhead: `benchmarks/hooks.py --sizes` (rows 64-512 x 512-1,024 tokens for `gpu`): the share of a
   step taken by the hooks' measurement, the post-update probe and the anchor set.
4. lab: the collapse lab's runner (`lldmon_lab.lab.runner`: `lldmon serve` on SQLite,
   examples/search_r1_grpo.py per run) with two runs built here, LLDS `off` and `auto`.
5. export: each run as `lldmon export` writes it (CSV; `lldmon import --format lldmon` reads it back),
   and the lab's records, logs, per-step metrics and service database in one archive.

OUT then holds at most 8 files, no deeper than one folder, as the device's `run` tool brings back:
`summary.json` and `summary.md` (the lab's summary), `overhead.md`, `gpu-lab.json` (phases, timings,
versions, the overhead rows, the runs and how to import them), `gpu-lab.log`, `runs/<run name>.csv`
(one per run) and `lab.tar.gz`. The lab's own folder (`--work`, default a new temporary folder) keeps
everything else.

`--size tiny` is the same on a CPU in a couple of minutes (2-layer model, 6 GRPO steps, tiny overhead
sizes): what CI runs (tests/test_gpu_lab.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

from lldmon_lab import gpu_wheels

__all__ = ["SIZES", "LabSize", "main"]

ROOT: Final = Path(__file__).resolve().parents[1]
SHIM: Final = ROOT / "scripts" / "gpu-lab-shim"
PROJECT: Final = "gpu-lab"
OUTPUTS: Final = ("gpu-lab.log", "gpu-lab.json", "summary.json", "summary.md", "overhead.md", "lab.tar.gz")
"""OUT's files besides `runs/*.csv`."""
MAX_FILES_BACK: Final = 8
"""The device's run tool brings back at most 8 files from $OUT."""
EXPORT_RESERVE_S: Final = 60.0
"""Kept back from the lab phase: stopping the trainings (they flush their client), the exports."""

IMPORT_CHECK: Final = (
    "trl.trainer.grpo_trainer",
    "accelerate",
    "pandas",
    "bm25s",
    "scipy.stats",
    "fastapi",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "monitor.cli",
    "monitor.api.app",
    "lldmon_lab.lab.runner",
    "trainer_hooks.trl",
)
"""What the lab imports, checked after the install (each in the same subprocess, first failure named)."""

PREFLIGHT: Final = """
import json, sys
import torch, transformers
info = {"python": sys.version.split()[0], "torch": torch.__version__,
        "transformers": transformers.__version__, "cuda": torch.cuda.is_available()}
if info["cuda"]:
    p = torch.cuda.get_device_properties(0)
    info.update(device_name=torch.cuda.get_device_name(0), bf16=torch.cuda.is_bf16_supported(),
                cuda_version=torch.version.cuda, memory_gib=round(p.total_memory / 2**30, 1))
print(json.dumps(info))
"""


@dataclass(frozen=True)
class LabSize:
    """Everything `--size` decides."""

    model: str
    device: str
    """Default `--device`."""
    steps: int
    warmup_steps: int | None
    batch_size: int | None
    max_completion_length: int
    threads: int
    """torch CPU threads per training (each run is one process)."""
    overhead_sizes: str
    overhead_micro_batch: int
    overhead_start_s: float
    """The benchmark starts no size after this long (`--max-seconds`)."""
    overhead_kill_s: float
    """... and is stopped after this long (it has written the sizes done)."""
    budget_s: float


SIZES: Final[dict[str, LabSize]] = {
    # One H200 (or H100), 9 minutes in all: install ~30-60 s, overhead <= ~2 min, the two runs in
    # parallel on the one GPU with what is left (the guard stops them and keeps what they logged).
    "gpu": LabSize(
        model="qwen2-150m",
        device="cuda",
        steps=60,
        warmup_steps=None,  # the model's default (300 supervised steps)
        batch_size=32,
        max_completion_length=96,
        threads=4,
        overhead_sizes="64x512,128x512,256x512,512x512,64x1024,128x1024,256x1024,512x1024",
        overhead_micro_batch=16,
        overhead_start_s=100.0,
        overhead_kill_s=170.0,
        budget_s=540.0,
    ),
    # A CPU in CI: the lab's `quick` sizes, a 2-layer model, tiny overhead sizes.
    "tiny": LabSize(
        model="tiny",
        device="cpu",
        steps=6,
        warmup_steps=30,
        batch_size=None,
        max_completion_length=96,
        threads=1,
        overhead_sizes="8x32,16x64",
        overhead_micro_batch=4,
        overhead_start_s=60.0,
        overhead_kill_s=180.0,
        budget_s=600.0,
    ),
}


class GpuLabError(Exception):
    """A lab that cannot go on; the message says why."""


@dataclass
class _Alarm:
    fired: bool = False


@contextlib.contextmanager
def _time_guard(seconds: float) -> Iterator[_Alarm]:
    """Interrupt the main thread after `seconds` as Ctrl-C would (SIGALRM raising KeyboardInterrupt),
    unless the block ends first: the lab's runner then stops its trainings and records what they did.
    `fired` tells a guard's interrupt from a person's."""
    alarm = _Alarm()

    def fire(signum: int, frame: FrameType | None) -> None:
        alarm.fired = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, seconds))
    try:
        yield alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    status: str = "ok"
    note: str = ""


@dataclass
class _Context:
    out: Path
    work: Path
    size: LabSize
    size_name: str
    device: str
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    phases: list[Phase] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def log(self, message: str) -> None:
        line = f"[{self.elapsed():6.1f}s] {message}"
        print(line, flush=True)
        with (self.out / "gpu-lab.log").open("a", encoding="utf-8") as f:
            f.write(line + "\n")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Phase]:
        phase = Phase(name)
        self.phases.append(phase)
        t0 = time.monotonic()
        self.log(f"phase {name}: start ({self.left():.0f}s of the budget left)")
        try:
            yield phase
        except BaseException as exc:
            phase.status, phase.note = "failed", str(exc) or type(exc).__name__
            raise
        finally:
            phase.seconds = round(time.monotonic() - t0, 1)
            self.log(
                f"phase {name}: {phase.status} in {phase.seconds:.1f}s{': ' + phase.note if phase.note else ''}"
            )
            self.write_report()

    def write_report(self) -> None:
        self.report["phases"] = [vars(p) for p in self.phases]
        self.report["seconds"] = round(self.elapsed(), 1)
        tmp = self.out / "gpu-lab.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, self.out / "gpu-lab.json")


# --------------------------------------------------------------------------------------------------
# environment


def _prepend_path(path: Path) -> None:
    """Put `path` first on this process's import path and on PYTHONPATH (inherited by every child:
    the service, the trainings, the benchmark, the exports)."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if str(path) not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(path), *entries])
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    importlib.invalidate_caches()


def prepare_environment(log: Callable[[str], None]) -> bool:
    """Offline, quiet children that import lldmon from this working tree; the stand-ins for
    `datasets` and pyarrow where the real ones are absent. Returns whether the stand-ins are used."""
    os.environ.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    _prepend_path(ROOT)
    if importlib.util.find_spec("datasets") is not None:
        return False
    # shadows an installed pyarrow too, harmlessly: only datasets and TRL's unused packing code import it
    _prepend_path(SHIM)
    log(f"datasets is not installed: using the stand-ins in {SHIM.relative_to(ROOT)} (see its README.md)")
    return True


def _run(command: Sequence[str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(command), capture_output=True, text=True, timeout=max(1.0, timeout), cwd=cwd, check=False
        )
    except subprocess.TimeoutExpired:
        raise GpuLabError(f"{shlex.join(command[:4])} ... did not finish in {timeout:.0f}s") from None


def install(ctx: _Context, wheels: Path) -> None:
    pins = gpu_wheels.read_pins()
    _, missing, _ = gpu_wheels.match_wheels(pins, wheels) if wheels.is_dir() else ({}, pins, [])
    if missing:
        raise GpuLabError(
            f"{wheels}: no wheel for {', '.join(map(str, missing))}: run scripts/gpu-lab-wheels.sh {wheels} "
            "where a package index is reachable, and carry the folder"
        )
    proc = _run(gpu_wheels.install_command(wheels), timeout=ctx.left() - 60)
    if proc.returncode != 0:
        raise GpuLabError(
            f"pip install failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    ctx.log(f"installed {len(pins)} pinned packages offline from {wheels}")


def import_check(ctx: _Context) -> None:
    code = f"import importlib\nfor name in {IMPORT_CHECK!r}:\n    importlib.import_module(name)\n"
    proc = _run([sys.executable, "-c", code], timeout=min(180.0, ctx.left() - 60))
    if proc.returncode != 0:
        raise GpuLabError(f"the lab's packages do not import:\n{(proc.stdout + proc.stderr)[-2000:]}")
    ctx.log(f"imports ok: {', '.join(IMPORT_CHECK)}")


def preflight(ctx: _Context) -> str:
    """Versions and the card; returns the device the runs use (`auto` resolved)."""
    proc = _run([sys.executable, "-c", PREFLIGHT], timeout=120)
    if proc.returncode != 0:
        raise GpuLabError(f"torch does not import:\n{(proc.stdout + proc.stderr)[-2000:]}")
    info: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("trl", "accelerate", "scipy", "pandas"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info[name] = importlib.metadata.version(name)
    ctx.report["environment"] = info
    device = ctx.device
    if device == "auto":
        device = "cuda" if info["cuda"] else "cpu"
    if device == "cuda" and not info["cuda"]:
        raise GpuLabError("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    card = (
        f"{info['device_name']}, {info['memory_gib']} GiB, bf16 {info['bf16']}" if info["cuda"] else "no GPU"
    )
    ctx.log(
        f"python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
        f"trl {info.get('trl', '?')}; {card}; training on {device}"
    )
    return device


# --------------------------------------------------------------------------------------------------
# overhead


def overhead(ctx: _Context, device: str) -> None:
    size = ctx.size
    data = ctx.work / "overhead.json"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "hooks.py"),
        "--sizes",
        size.overhead_sizes,
        "--model",
        size.model,
        "--device",
        device,
        "--micro-batch",
        str(size.overhead_micro_batch),
        "--threads",
        str(size.threads),
        "--max-seconds",
        str(min(size.overhead_start_s, max(1.0, ctx.left() - 300))),
        "--json",
        str(data),
        "--markdown",
        str(ctx.out / "overhead.md"),
    ]
    limit = min(size.overhead_kill_s, max(30.0, ctx.left() - 240))
    ctx.log(f"overhead: {shlex.join(command[1:])} (stopped after {limit:.0f}s)")
    log_path = ctx.work / "overhead.log"
    with log_path.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    rows: list[dict[str, Any]] = []
    if data.is_file():
        result = json.loads(data.read_text(encoding="utf-8"))
        ctx.report["overhead"] = result
        rows = result.get("rows", [])
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if " x " in line and ("step" in line or "out of" in line):
            ctx.log(f"  {line.strip()}")
    if code is None:
        raise GpuLabError(f"stopped by its guard after {limit:.0f}s with {len(rows)} sizes done")
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise GpuLabError(f"benchmarks/hooks.py exited {code} with {len(rows)} sizes done:\n{tail}")


# --------------------------------------------------------------------------------------------------
# lab


def lab_runs(size: LabSize, device: str) -> list[Any]:
    """The two runs: LLDS off and `auto`, seed 0, the size's model on `device`."""
    from lldmon_lab.lab.grid import RunSpec, Setting

    common: dict[str, Any] = {
        "model": size.model,
        "steps": size.steps,
        "warmup_steps": size.warmup_steps,
        "batch_size": size.batch_size,
        "max_completion_length": size.max_completion_length,
        "extra": ("--device", device),
    }
    return [RunSpec(Setting(llds=mode, **common), 0) for mode in ("off", "auto")]


def lab(ctx: _Context, device: str, command_line: str) -> None:
    from rich.console import Console

    from lldmon_lab.lab.runner import LabError, LabOptions, run_lab

    runs = lab_runs(ctx.size, device)
    limit = ctx.left() - EXPORT_RESERVE_S
    if limit < 30:
        raise GpuLabError(f"only {ctx.left():.0f}s of the budget left: no time for the runs")
    options = LabOptions(
        out=ctx.work / "lab",
        runs=runs,
        jobs=len(runs),
        project=PROJECT,
        threads=ctx.size.threads,
        command_line=command_line,
    )
    ctx.log(
        f"lab: {len(runs)} runs in parallel ({', '.join(r.key for r in runs)}), stopped after {limit:.0f}s"
    )
    console = Console(width=160)
    alarm = _Alarm()
    try:
        with _time_guard(limit) as alarm:
            report = run_lab(options, console)
    except KeyboardInterrupt:
        if not alarm.fired:
            raise
        raise GpuLabError(f"stopped by its guard after {limit:.0f}s before the runs started") from None
    except LabError as exc:
        raise GpuLabError(str(exc)) from None
    if report.interrupted:
        raise GpuLabError(f"stopped by its guard after {limit:.0f}s; the runs are recorded as interrupted")
    if report.failed:
        raise GpuLabError(f"runs failed: {', '.join(report.failed)} (logs in {options.out / 'logs'})")


# --------------------------------------------------------------------------------------------------
# export


def _lldmon(*args: str) -> list[str]:
    code = "import sys; from monitor.cli import main; sys.argv[0] = 'lldmon'; main()"
    return [sys.executable, "-c", code, *args]


def export(ctx: _Context) -> None:
    from lldmon_lab.lab.results import read_records

    lab_dir = ctx.work / "lab"
    for name in ("summary.json", "summary.md"):
        if (lab_dir / name).is_file():
            shutil.copy2(lab_dir / name, ctx.out / name)
    records = read_records(lab_dir / "runs") if (lab_dir / "runs").is_dir() else {}
    runs_out = ctx.out / "runs"
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for key in sorted(records):
        record = records[key]
        name, run_id = str(record.get("run_name") or key), record.get("run_id")
        row = {
            "key": key,
            "run_name": name,
            "llds": (record.get("setting") or {}).get("llds"),
            "status": record.get("status"),
            "last_step": (record.get("run") or {}).get("last_step"),
            "seconds": record.get("seconds"),
            "file": None,
        }
        rows.append(row)
        if run_id is None:
            ctx.log(f"export: {name} never reached the service; nothing to export")
            continue
        runs_out.mkdir(exist_ok=True)
        target = runs_out / f"{name}.csv"
        command = _lldmon("export", str(run_id), "--data-dir", str(lab_dir / "lldmon"), "-o", str(target))
        try:
            proc = _run(command, timeout=max(10.0, min(120.0, ctx.left())))
        except GpuLabError as exc:
            failed.append(f"{name}: {exc}")
            continue
        if proc.returncode != 0:
            failed.append(
                f"{name}: lldmon export exited {proc.returncode}: {(proc.stdout + proc.stderr)[-800:]}"
            )
            continue
        row["file"] = str(target.relative_to(ctx.out))
        ctx.log(f"export: {row['file']} ({row['status']}, last step {row['last_step']})")
    ctx.report["runs"] = rows
    ctx.report["import"] = (
        f'for f in runs/*.csv; do lldmon import "$f" --format lldmon --project {PROJECT} '
        '--run "$(basename "$f" .csv)"; done'
    )
    archive = ctx.out / "lab.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(lab_dir.rglob("*")):
            rel = path.relative_to(lab_dir)
            keep = path.is_file() and (
                rel.parts[0] in ("runs", "logs", "lldmon")
                or rel.name in ("summary.json", "summary.md")
                or (rel.parts[0] == "work" and rel.name in ("metrics.jsonl", "summary.json"))
            )
            if keep:
                tar.add(path, arcname=str(Path("lab") / rel))
        for extra in ("overhead.json", "overhead.log"):
            if (ctx.work / extra).is_file():
                tar.add(ctx.work / extra, arcname=extra)
    ctx.log(
        f"export: {archive.name} ({archive.stat().st_size / 1e3:.0f} kB: records, logs, metrics, database)"
    )
    if failed:
        raise GpuLabError("runs not exported:\n" + "\n".join(failed))


def check_out(ctx: _Context) -> None:
    """Warn where OUT would not come back whole from the device's run tool."""
    files = [p for p in ctx.out.rglob("*") if p.is_file() and not p.name.endswith(".tmp")]
    if len(files) > MAX_FILES_BACK:
        ctx.log(
            f"warning: {len(files)} files in {ctx.out}; the device's run tool brings back {MAX_FILES_BACK}"
        )
    for path in files:
        if path.stat().st_size > 16 * 1024 * 1024 or len(path.relative_to(ctx.out).parts) > 3:
            ctx.log(f"warning: {path} is too large or too deep to come back from the device")


# --------------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lldmon_lab.gpu_lab", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="results folder (the device sets $OUT)")
    p.add_argument("--size", choices=sorted(SIZES), default="gpu")
    p.add_argument("--device", choices=("cuda", "cpu", "auto"), default=None, help="default: the size's")
    p.add_argument("--wheels", type=Path, default=None, help="install this folder's wheels first (offline)")
    p.add_argument("--install-only", action="store_true", help="install and check the imports, then stop")
    p.add_argument(
        "--work", type=Path, default=None, help="the lab's own folder (default: a new temporary one)"
    )
    p.add_argument("--budget-s", type=float, default=None, help="time for everything (default: the size's)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the size's)")
    p.add_argument("--skip-overhead", action="store_true", help="no hooks-overhead table")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be >= 1")
    if args.budget_s is not None and args.budget_s <= 0:
        p.error("--budget-s must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    size = SIZES[args.size]
    if args.steps is not None:
        size = dataclasses.replace(size, steps=args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in (*OUTPUTS, *args.out.glob("runs/*.csv")):  # an earlier lab's results, never mixed in
        (args.out / stale).unlink(missing_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="lldmon-gpu-lab-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = _Context(
        out=args.out,
        work=work,
        size=size,
        size_name=args.size,
        device=args.device or size.device,
        budget_s=args.budget_s or size.budget_s,
    )
    command_line = shlex.join([sys.executable, "-m", "lldmon_lab.gpu_lab", *(argv or sys.argv[1:])])
    ctx.report.update(
        {"command": command_line, "size": args.size, "budget_s": ctx.budget_s, "work": str(work)}
    )
    ctx.log(
        f"GPU lab, size {args.size} ({size.model}), budget {ctx.budget_s:.0f}s, out {args.out}, work {work}"
    )
    failed: list[str] = []
    try:
        if args.wheels is not None:
            with ctx.phase("install"):
                install(ctx, args.wheels)
        with ctx.phase("environment"):
            ctx.report["stand_ins"] = prepare_environment(ctx.log)
            if args.wheels is not None or args.install_only:
                import_check(ctx)
        if args.install_only:
            return 0
        with ctx.phase("preflight"):
            device = preflight(ctx)
        ctx.report["device"] = device
        steps: list[tuple[str, Callable[[], None]]] = [
            ("overhead", lambda: overhead(ctx, device)),
            ("lab", lambda: lab(ctx, device, command_line)),
        ]
        for name, step in steps:
            if name == "overhead" and args.skip_overhead:
                continue
            try:
                with ctx.phase(name):
                    step()
            except GpuLabError:
                failed.append(name)  # the next phases still run: what this one wrote is kept
        with ctx.phase("export"):
            export(ctx)
    except GpuLabError as exc:
        ctx.log(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        ctx.log("interrupted")
        return 130
    finally:
        ctx.write_report()
        check_out(ctx)
    ctx.log(
        f"done in {ctx.elapsed():.0f}s"
        + (f"; incomplete phases: {', '.join(failed)}" if failed else "")
        + f"; results in {args.out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
