"""The GPU lab (scripts/gpu-lab.sh, lldmon_lab/gpu_lab.py): its CPU size end to end (runs exported and
importable into a fresh service database, the summary with both arms, the hooks-overhead table, what
the device's run tool brings back), and its wheel list (complete for this environment, within the
carry budget, installable offline into a bare Python that has only torch and transformers, where the
stand-ins for `datasets` and pyarrow train exactly as the real packages do)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

from lldmon_lab import gpu_wheels
from lldmon_lab.gpu_lab import SIZES, _time_guard
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[1]
LLDMON = str(Path(sys.executable).parent / "lldmon")

LEFT_OUT = {"datasets", "pyarrow", "dash", "plotly", "uvloop", "httptools", "watchfiles", "websockets"}
"""Not shipped, with everything only they need (scripts/gpu-lab-requirements.txt says why)."""


def _requires(name: str, extras: set[str]) -> list[tuple[str, set[str]]]:
    out = []
    for text in md.distribution(name).requires or []:
        req = Requirement(text)
        marker: Marker | None = req.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in {"", *extras}):
            out.append((gpu_wheels.normalise(req.name), set(req.extras)))
    return out


def _closure(roots: list[tuple[str, set[str]]], skip: set[str]) -> set[str]:
    seen: dict[str, set[str]] = {}
    todo = list(roots)
    while todo:
        name, extras = todo.pop()
        if name in skip or (name in seen and extras <= seen[name]):
            continue
        seen.setdefault(name, set()).update(extras)
        if name == "uvicorn":
            extras = extras - {"standard"}
        todo += _requires(name, extras)
    return set(seen)


def _give_torch_and_transformers(python: str, site: Path) -> None:
    """Make torch and transformers (with what they require, as this environment has them installed)
    importable and pip-visible in the venv of `python`, and nothing else: the device machine's
    preinstalled packages. Their files are linked into `site`, which a .pth file puts on the venv's
    path (linking, not installing: the same distributions, without minutes of unpacking torch)."""
    site.mkdir()
    for name in sorted(_closure([("torch", set()), ("transformers", set())], skip=set())):
        dist = md.distribution(name)
        top = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for entry in top:
            source = Path(str(dist.locate_file(entry)))
            if source.exists() and not (site / entry).exists():
                (site / entry).symlink_to(source)

    def ask(code: str) -> str:
        return subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout

    purelib = ask("import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    (Path(purelib) / "device-preinstalled.pth").write_text(f"{site}\n")
    versions = ask("import torch, transformers; print(torch.__version__, transformers.__version__)").split()
    assert versions == [md.version("torch"), md.version("transformers")]


def test_the_wheel_list_pins_what_the_lab_needs_beyond_torch_and_transformers() -> None:
    """The list is what lldmon's server and hooks extras add to torch, transformers and their own
    dependencies (less `LEFT_OUT`), at this environment's versions: the versions the tests run."""
    base = _closure([("torch", set()), ("transformers", set())], set())
    lab = _closure(_requires("lldmon", {"server", "hooks"}), LEFT_OUT) - {"lldmon"}
    expected = {name: md.version(name) for name in lab - base}
    listed = {p.key: p.version for p in gpu_wheels.read_pins()}
    assert listed == expected, (
        "update scripts/gpu-lab-requirements.txt: missing "
        f"{sorted(set(expected.items()) - set(listed.items()))}, not needed or other versions "
        f"{sorted(set(listed.items()) - set(expected.items()))}"
    )


def test_a_wheel_list_line_must_be_pinned_once(tmp_path: Path) -> None:
    bad = tmp_path / "list.txt"
    bad.write_text("# comment\ntrl==1.16.0\nscipy>=1.11\n")
    with pytest.raises(gpu_wheels.WheelListError, match=r"list.txt:3: 'scipy>=1.11' is not pinned"):
        gpu_wheels.read_pins(bad)
    bad.write_text("trl==1.16.0\nTRL==1.16.0\n")
    with pytest.raises(gpu_wheels.WheelListError, match="TRL is listed twice"):
        gpu_wheels.read_pins(bad)


def _wheel(directory: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path


def test_a_folder_must_hold_exactly_the_listed_wheels(tmp_path: Path) -> None:
    pins = [gpu_wheels.Pin("fast_api", "1.0"), gpu_wheels.Pin("trl", "1.16.0")]
    _wheel(tmp_path, "fast_api", "1.0", {"a.py": b"x"})
    _wheel(tmp_path, "trl", "1.15.0", {"b.py": b"y"})
    found, missing, extra = gpu_wheels.match_wheels(pins, tmp_path)
    assert [p.name for p in found] == ["fast_api"]
    assert missing == [pins[1]]
    assert [p.name for p in extra] == ["trl-1.15.0-py3-none-any.whl"]
    with pytest.raises(gpu_wheels.WheelListError, match=r"no wheel for trl==1\.16\.0"):
        gpu_wheels.check(tmp_path, pins=pins, root=ROOT, log=lambda _: None)


def test_repacking_keeps_every_member_and_shrinks_the_archive(tmp_path: Path) -> None:
    members = {
        "pkg/__init__.py": b"x = 1\n" * 20_000,
        "pkg-1.0.dist-info/RECORD": b"pkg/__init__.py,sha256=abc,120000\n",
        "pkg/empty.py": b"",
    }
    path = _wheel(tmp_path, "pkg", "1.0", members)
    before, after = gpu_wheels.repack_lzma(path)
    assert after < before
    with zipfile.ZipFile(path) as archive:
        assert {i.filename: archive.read(i) for i in archive.infolist()} == members
        assert {i.compress_type for i in archive.infolist() if i.file_size} == {zipfile.ZIP_LZMA}


def test_a_folder_over_the_carry_budget_fails_the_check(tmp_path: Path, monkeypatch: Any) -> None:
    pins = [gpu_wheels.Pin("pkg", "1.0")]
    _wheel(tmp_path, "pkg", "1.0", {"pkg/__init__.py": os.urandom(50_000)})
    lines: list[str] = []
    monkeypatch.setattr(gpu_wheels, "BUDGET_BYTES", gpu_wheels.tree_bytes(ROOT) + 10_000)
    assert gpu_wheels.check(tmp_path, pins=pins, root=ROOT, log=lines.append) is False
    assert "over the budget" in lines[-1]


def test_the_time_guard_interrupts_the_block_and_disarms_after_it() -> None:
    previous = signal.getsignal(signal.SIGALRM)
    with pytest.raises(KeyboardInterrupt), _time_guard(0.05) as alarm:
        threading.Event().wait(30)  # the alarm ends this wait
    assert alarm.fired
    with _time_guard(30) as quiet:
        pass
    assert not quiet.fired
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) == previous


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_lab_stopped_by_its_guard_still_records_and_exports_its_runs(tmp_path: Path) -> None:
    """A guard that fires while both runs train (400 steps; SIGALRM, which is how the guard fires, sent
    once a run has logged two GRPO steps, so nothing depends on how fast this machine is) stops both
    runs, which are recorded as interrupted, exported with the steps they logged (a run registers with
    the service after its warm-up: one stopped before has nothing to export), and summarised."""
    out, work = tmp_path / "out", tmp_path / "work"
    command = [sys.executable, "-m", "lldmon_lab.gpu_lab", "--size", "tiny", "--out", str(out)]
    command += ["--work", str(work), "--steps", "400", "--budget-s", "3600", "--skip-overhead"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + scaled(400)  # a hung lab fails here instead of at pytest's timeout
    try:
        while not any(
            re.search(r"^\[\s*[0-9.]+s\] step 2/400", log.read_text(errors="replace"), re.M)
            for log in (work / "lab" / "logs").glob("*.log")
        ):
            assert proc.poll() is None, "".join(output)[-3000:]
            assert time.monotonic() < deadline, "no run logged 2 GRPO steps:\n" + "".join(output)[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGALRM)
        assert proc.wait(timeout=scaled(300)) == 1, "".join(output)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    report = json.loads((out / "gpu-lab.json").read_text())
    phases = {p["name"]: p for p in report["phases"]}
    assert phases["lab"]["status"] == "failed" and "stopped by its guard" in phases["lab"]["note"]
    assert phases["export"]["status"] == "ok"
    assert sorted(r["status"] for r in report["runs"]) == ["interrupted", "interrupted"]
    exported = [run for run in report["runs"] if run["last_step"] is not None]
    assert exported, report["runs"]
    for run in exported:
        lines = (out / run["file"]).read_text().splitlines()
        assert 1 < len(lines) < 1 + 400  # some steps, not all
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(r["status"] for r in summary["runs"]) == ["interrupted", "interrupted"]


def check_tiny_lab_output(out: Path, tmp_path: Path) -> None:
    """What `scripts/gpu-lab.sh --size tiny` leaves in OUT: both arms finished and summarised, every
    run exported and read back by `lldmon import` unchanged, and the overhead table."""
    # what the device's run tool brings back: at most 8 files, at most one folder down
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8, files
    assert all(len(f.parts) <= 2 and re.fullmatch(r"[A-Za-z0-9._-]+", f.name) for f in files), files

    report = json.loads((out / "gpu-lab.json").read_text())
    assert [(p["name"], p["status"]) for p in report["phases"]] == [
        ("install", "ok"),
        ("environment", "ok"),
        ("preflight", "ok"),
        ("overhead", "ok"),
        ("lab", "ok"),
        ("export", "ok"),
    ]

    summary = json.loads((out / "summary.json").read_text())
    assert sorted((r["setting"]["llds"], r["status"]) for r in summary["runs"]) == [
        ("auto", "finished"),
        ("off", "finished"),
    ]
    assert sorted(g["arm"] for g in summary["groups"]) == ["auto", "off"]
    assert summary["groups"][0]["group"] in (out / "summary.md").read_text()

    # every run exported, and `lldmon import` reads it back into a fresh database unchanged
    fresh = tmp_path / "fresh"
    assert sorted(f"runs/{r['run_name']}.csv" for r in summary["runs"]) == sorted(
        r["file"] for r in report["runs"]
    )
    for run in summary["runs"]:
        exported = out / "runs" / f"{run['run_name']}.csv"
        subprocess.run(
            [
                *(LLDMON, "import", str(exported), "--format", "lldmon", "--project", "gpu-lab"),
                *("--run", run["run_name"], "--data-dir", str(fresh)),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        again = tmp_path / "again.csv"
        subprocess.run(
            [
                LLDMON,
                "export",
                run["run_name"],
                "--project",
                "gpu-lab",
                "--data-dir",
                str(fresh),
                "-o",
                str(again),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        assert again.read_bytes() == exported.read_bytes()
        header = exported.read_text().splitlines()[0].split(",")
        assert {"reward/mean", "entropy/mean", "grad/norm", "garbled/frac"} <= set(header)
        assert len(exported.read_text().splitlines()) == 1 + SIZES["tiny"].steps

    # the overhead table: one row per size, each part a share of the step
    rows = report["overhead"]["rows"]
    assert [(r["rows"], r["tokens"]) for r in rows] == [(8, 32), (16, 64)]
    for r in rows:
        assert r["step_ms"] > 0
        for part in ("measure_share", "probe_share", "anchor_share"):
            assert 0 < r[part] < 1, (part, r)
        assert r["hooks_share"] == pytest.approx(r["measure_share"] + r["probe_share"] + r["anchor_share"])
    table = (out / "overhead.md").read_text()
    assert "| 8 | 32 |" in table and "| 16 | 64 |" in table


def _metrics(path: Path) -> list[dict[str, Any]]:
    """Per-step metrics of the example's --metrics-jsonl, without the wall-clock ones."""
    timing = re.compile(r"time|runtime|per_second|flos")
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.append({k: v for k, v in row["metrics"].items() if not timing.search(k) and v == v})
    return out


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_wheels_fit_the_budget_and_the_lab_runs_from_them_in_a_bare_python(tmp_path: Path) -> None:
    """Download and repack the list (scripts/gpu-lab-wheels.sh), then the device's path in a new venv
    that has only torch and transformers (this environment's, linked in: `_give_torch_and_transformers`):
    `scripts/gpu-lab.sh --size tiny` with the wheels installs them offline, checks the imports and runs
    the whole lab on the stand-ins for `datasets` and pyarrow, with the service but without its
    dashboard, and leaves what `check_tiny_lab_output` expects (one test for both: the lab is minutes
    of CI). Two GRPO steps on the stand-ins log the metrics this environment's real packages log."""
    wheels = tmp_path / "wheels"
    fetch = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-lab-wheels.sh"), str(wheels)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=scaled(600),
        check=False,
    )
    assert fetch.returncode == 0, fetch.stdout[-3000:] + fetch.stderr[-3000:]
    total = re.search(r"= ([0-9.]+) MiB of the 64 MiB the device carries", fetch.stdout)
    assert total is not None and float(total.group(1)) <= 64, fetch.stdout[-2000:]

    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    _give_torch_and_transformers(python, tmp_path / "device-site")
    bare_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    assert (
        subprocess.run([python, "-c", "import datasets"], capture_output=True, env=bare_env).returncode != 0
    )

    out, work = tmp_path / "out", tmp_path / "work"
    lab = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu-lab.sh"),
            "--size",
            "tiny",
            "--out",
            str(out),
            "--work",
            str(work),
        ],
        capture_output=True,
        text=True,
        env={**bare_env, "PYTHON": python, "GPU_LAB_WHEELS": str(wheels)},
        stdin=subprocess.DEVNULL,
        timeout=scaled(1200),
        check=False,
    )
    assert lab.returncode == 0, lab.stdout[-4000:] + lab.stderr[-3000:]
    assert f"installed {len(gpu_wheels.read_pins())} pinned packages offline" in lab.stdout
    assert "using the stand-ins" in lab.stdout and "imports ok" in lab.stdout
    check_tiny_lab_output(out, tmp_path)
    subprocess.run(
        [python, "-c", "import lldmon_lab, monitor, trainer_hooks, trl"],
        check=True,
        cwd=tmp_path,
        env={**bare_env, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )

    script = [str(ROOT / "examples" / "search_r1_grpo.py"), "--steps", "2", "--warmup-steps", "5"]
    shim = f"{ROOT}{os.pathsep}{ROOT / 'scripts' / 'gpu-lab-shim'}"
    for exe, env, name in (
        (python, {**bare_env, "PYTHONPATH": shim, "HF_HUB_OFFLINE": "1"}, "bare"),
        (sys.executable, {**os.environ, "HF_HUB_OFFLINE": "1"}, "dev"),
    ):
        subprocess.run(
            [exe, *script, "--metrics-jsonl", str(tmp_path / f"{name}.jsonl")],
            check=True,
            capture_output=True,
            env=env,
            timeout=scaled(600),
        )
    assert _metrics(tmp_path / "bare.jsonl") == _metrics(tmp_path / "dev.jsonl")
