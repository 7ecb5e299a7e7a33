"""The GPU lab's wheels: the pinned list, the carry budget they share with the working tree, LZMA
repacking of the large ones, and their offline install on the device machine.

The device machine has Python with PyTorch and transformers and no network; everything else the lab
needs travels as wheels named in `scripts/gpu-lab-requirements.txt` (one `name==version` a line), in
one folder that, with the working tree, must stay under `BUDGET_BYTES` (what the device's `run` tool
carries). `scripts/gpu-lab-wheels.sh DIR` downloads them and runs `check DIR --repack --prune` here.

Why repack: the list is about 57 MB as published (scipy alone is 35 MB, pandas 12 MB), which with a
9-10 MiB working tree leaves under a MiB. Re-compressing the members of the wheels over
`REPACK_MIN_BYTES` with LZMA (zip method 14, which Python's `zipfile`, and so pip, reads) keeps every
file, its name, its mode and its RECORD hash; only the archive shrinks (scipy 35.3 -> 26.5 MB). pip
installs such a wheel as any other.

Stdlib only: this module runs before anything is installed on the device.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "BUDGET_BYTES",
    "REQUIREMENTS",
    "Pin",
    "WheelListError",
    "check",
    "install_command",
    "match_wheels",
    "read_pins",
    "repack_lzma",
    "tree_bytes",
]

ROOT: Final = Path(__file__).resolve().parents[1]
REQUIREMENTS: Final = ROOT / "scripts" / "gpu-lab-requirements.txt"
BUDGET_BYTES: Final = 64 * 1024 * 1024
"""The device's `run` tool carries at most 64 MiB: the working tree and the carried wheel folder."""
REPACK_MIN_BYTES: Final = 2_000_000
"""Wheels larger than this are re-compressed with LZMA (the small ones would gain kilobytes)."""
MIB: Final = 1024 * 1024

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


class WheelListError(ValueError):
    """A wheel list or folder that cannot be used; the message names the line or the file."""


@dataclass(frozen=True)
class Pin:
    name: str
    version: str

    @property
    def key(self) -> str:
        return normalise(self.name)

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def normalise(name: str) -> str:
    """A project name as PEP 503 compares them (`Foo_Bar` == `foo-bar`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path = REQUIREMENTS) -> list[Pin]:
    """The `name==version` lines of `path` (comments and blank lines skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WheelListError(f"cannot read the wheel list {path}: {exc.strerror or exc}") from None
    pins: list[Pin] = []
    seen: set[str] = set()
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        if match is None:
            raise WheelListError(f"{path}:{number}: {line!r} is not pinned as name==version")
        pin = Pin(match.group(1), match.group(2))
        if pin.key in seen:
            raise WheelListError(f"{path}:{number}: {pin.name} is listed twice")
        seen.add(pin.key)
        pins.append(pin)
    if not pins:
        raise WheelListError(f"{path}: no pinned package")
    return pins


def _wheel_name(path: Path) -> tuple[str, str] | None:
    """(normalised project name, version) of a wheel file name, None for another file."""
    if path.suffix != ".whl":
        return None
    parts = path.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        return None
    return normalise(parts[0]), parts[1]


def match_wheels(pins: Sequence[Pin], directory: Path) -> tuple[dict[Pin, Path], list[Pin], list[Path]]:
    """(the wheel of each pin found in `directory`, the pins without one, the files that belong to no
    pin: other wheels or versions, anything else)."""
    wanted = {(p.key, p.version): p for p in pins}
    found: dict[Pin, Path] = {}
    extra: list[Path] = []
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        name = _wheel_name(path)
        pin = wanted.get(name) if name is not None else None
        if pin is None or pin in found:
            extra.append(path)
        else:
            found[pin] = path
    return found, [p for p in pins if p not in found], extra


def _is_lzma(path: Path) -> bool:
    with zipfile.ZipFile(path) as archive:
        return all(i.compress_type == zipfile.ZIP_LZMA for i in archive.infolist() if i.file_size)


def repack_lzma(path: Path) -> tuple[int, int]:
    """Re-compress every member of the wheel `path` with LZMA, in place (atomically); returns the size
    before and after. Names, dates, modes and contents are kept, so the RECORD hashes still hold."""
    before = path.stat().st_size
    tmp = path.with_name(path.name + ".lzma-tmp")
    try:
        with zipfile.ZipFile(path) as source, zipfile.ZipFile(tmp, "w") as target:
            for info in source.infolist():
                copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                copy.external_attr = info.external_attr
                copy.create_system = info.create_system
                copy.compress_type = zipfile.ZIP_LZMA if info.file_size else zipfile.ZIP_STORED
                target.writestr(copy, source.read(info))
        with zipfile.ZipFile(tmp) as written:
            broken = written.testzip()
        if broken is not None:
            raise WheelListError(f"{path.name}: {broken} did not survive repacking")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return before, path.stat().st_size


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what the device's `run` tool sends besides the carried paths: tracked files and
    untracked files that git does not ignore (and a `shared/` folder inside the checkout)."""
    try:
        listing = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise WheelListError(f"cannot list the working tree of {root} with git: {exc}") from None
    files = {root / name for name in listing.decode("utf-8", "surrogateescape").split("\0") if name}
    shared = root / "shared"
    if shared.is_dir():
        files.update(p for p in shared.rglob("*") if p.is_file())
    return sum(p.lstat().st_size for p in files if p.exists() or p.is_symlink())


def folder_bytes(directory: Path) -> int:
    return sum(p.lstat().st_size for p in directory.rglob("*") if p.is_file() or p.is_symlink())


def _repack_many(paths: Iterable[Path], log: Callable[[str], None]) -> None:
    todo = [p for p in paths if p.stat().st_size > REPACK_MIN_BYTES and not _is_lzma(p)]
    if not todo:
        return
    log(f"repacking {len(todo)} wheels over {REPACK_MIN_BYTES / 1e6:.0f} MB with LZMA (a minute or two) ...")
    with ProcessPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        for path, (before, after) in zip(todo, pool.map(repack_lzma, todo), strict=True):
            log(f"  {path.name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")


def check(
    directory: Path,
    *,
    pins: Sequence[Pin] | None = None,
    root: Path = ROOT,
    repack: bool = False,
    prune: bool = False,
    log: Callable[[str], None] = print,
) -> bool:
    """Check that `directory` holds exactly the list's wheels and that it fits the carry budget with
    the working tree; print the sizes. `repack`: LZMA the large wheels first; `prune`: delete the
    files that belong to no pin (an earlier list's wheels) instead of failing on them."""
    pins = read_pins() if pins is None else pins
    if not directory.is_dir():
        raise WheelListError(f"{directory}: no such folder")
    found, missing, extra = match_wheels(pins, directory)
    if missing:
        raise WheelListError(
            f"{directory}: no wheel for {', '.join(map(str, missing))} (scripts/gpu-lab-wheels.sh downloads them)"
        )
    if extra:
        if not prune:
            raise WheelListError(
                f"{directory}: files of no listed package: {', '.join(p.name for p in extra)}"
            )
        for path in extra:
            log(f"removing {path.name} (not in the list)")
            path.unlink()
    if repack:
        _repack_many(found.values(), log)
    for pin in sorted(found, key=lambda p: -found[p].stat().st_size):
        log(f"  {found[pin].stat().st_size / MIB:7.2f} MiB  {found[pin].name}")
    wheels, tree = folder_bytes(directory), tree_bytes(root)
    total = wheels + tree
    log(
        f"wheels {wheels / MIB:.2f} MiB ({len(found)} files) + working tree {tree / MIB:.2f} MiB = "
        f"{total / MIB:.2f} MiB of the {BUDGET_BYTES / MIB:.0f} MiB the device carries "
        f"({(BUDGET_BYTES - total) / MIB:+.2f} MiB left)"
    )
    if total > BUDGET_BYTES:
        log("over the budget: the device's run tool would refuse the call")
        return False
    return True


def install_command(
    directory: Path, python: str = sys.executable, requirements: Path = REQUIREMENTS
) -> list[str]:
    """pip, offline, the list's wheels from `directory` only, without dependency resolution: the list
    is complete by construction, and TRL's own `datasets` requirement is deliberately not shipped
    (scripts/gpu-lab-shim/README.md)."""
    return [
        python,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        str(directory),
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "-r",
        str(requirements),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lldmon_lab.gpu_wheels", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("missing", help="print the pins (name==version) that have no wheel in a folder yet")
    m.add_argument("directory", type=Path)
    p = sub.add_parser("check", help="check a wheel folder against the list and the carry budget")
    p.add_argument("directory", type=Path)
    p.add_argument("--repack", action="store_true", help="re-compress the large wheels with LZMA first")
    p.add_argument("--prune", action="store_true", help="delete files that belong to no listed package")
    args = parser.parse_args(argv)
    try:
        if args.command == "missing":
            pins = read_pins()
            _, missing, _ = match_wheels(pins, args.directory) if args.directory.is_dir() else ({}, pins, [])
            print("\n".join(map(str, missing)))
            return 0
        ok = check(args.directory, repack=args.repack, prune=args.prune)
    except WheelListError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
