"""On-disk spool of ingest batches that could not be delivered, and the loop that replays it.

Shared by `trainer_hooks.client` (spools while the service is unreachable, replays when it is back)
and `lldmon sync DIR` (uploads leftovers). Stdlib only; the transport is a parameter of `replay`.

Layout of a spool directory::

    <dir>/<20-digit ns>-<batch_id>.json.gz   one batch per file, oldest first by name
    <dir>/finish-<run hash>.json             a run's final status, for after its batches (below)
    <dir>/rejected/...                       batches the service refused (4xx validation), same format
    <dir>/corrupt/...                        files that could not be read, kept for inspection

The 20-digit prefix is when the batch's oldest data was logged (`write_entry(..., order_ns=)`), not
when the file was written: a batch held up by retries while newer data overflowed to disk still
sorts before that newer data, so replays go in logging order and the size limit drops the oldest
data, never a stretch in the middle.

Each file is gzip-compressed JSON::

    {"format": "lldmon-spool", "version": 1, "kind": "metrics" | "actions", "created_at": <unix s>,
     "run": {"project": str | null, "run_name": str, "config": {...}, "tags": [...]},
     "body": {"batch_id": "...", ...}}            # the exact ingest body (`contracts.wire`)

The run is identified by (project, run_name), never by a server id, so a spool can be replayed into
a fresh server. The body keeps its `batch_id`, so a replay after a lost acknowledgement is a no-op
on the server (its batch ledger answers `"duplicate": true`): nothing is lost and nothing is stored
twice.

Files are written to a temporary name and renamed (`os.replace`), so a reader never sees a partial
file after a crash of the writer (not fsync'ed: a power loss may lose the newest files).

A finish marker (`write_finish`) records how a job ended (finished / failed / crashed) when the
service could not be told, or when batches are left: `lldmon sync` applies it once every batch of the
directory is delivered, so a run uploaded later does not stay "running".

Size policy: `write_entry(..., max_bytes=N)` keeps the total size of the entries directly in `dir`
at most N bytes by deleting the OLDEST entries first (the newest data is the most useful one for
collapse detection); a new entry that alone is larger than N is not kept (and nothing else is
dropped for it). The
`WriteReport` says how many batches and bytes were dropped. `rejected/` and `corrupt/` are not
counted in the spool's size; `replay(..., rejected_max_bytes=N)` bounds `rejected/` the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from contracts.wire import FINISH_STATUSES

__all__ = [
    "CORRUPT_DIR",
    "REJECTED_DIR",
    "Kind",
    "Outcome",
    "ReplayReport",
    "RunIdentity",
    "SpoolEntry",
    "WriteReport",
    "find_spool_dirs",
    "iter_entries",
    "move_to",
    "outcome_for_status",
    "read_entry",
    "read_finishes",
    "remove",
    "remove_finish",
    "replay",
    "spool_size",
    "write_entry",
    "write_finish",
]

Kind = Literal["metrics", "actions"]
Outcome = Literal["ok", "retry", "reject"]

FORMAT: Final = "lldmon-spool"
VERSION: Final = 1
SUFFIX: Final = ".json.gz"
REJECTED_DIR: Final = "rejected"
CORRUPT_DIR: Final = "corrupt"
_TMP_PREFIX: Final = ".tmp-"
_STALE_TMP_SECONDS: Final = 3600.0
_NAME_RE: Final = re.compile(r"^\d{20}-[A-Za-z0-9._-]{1,64}\.json\.gz$")
FINISH_FORMAT: Final = "lldmon-spool-finish"
_FINISH_RE: Final = re.compile(r"^finish-[0-9a-f]{16}\.json$")
_KINDS: Final = ("metrics", "actions")

log = logging.getLogger("lldmon.spool")

_lock = threading.Lock()  # orders names within the process and serialises size enforcement
_last_ns = 0


@dataclass(frozen=True)
class RunIdentity:
    """Server-independent identity of a run: the service gets-or-creates it by (project, run_name)."""

    run_name: str
    project: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()

    def register_body(self) -> dict[str, Any]:
        """The body of `POST /api/v1/runs`."""
        body: dict[str, Any] = {"name": self.run_name, "config": dict(self.config), "tags": list(self.tags)}
        if self.project is not None:
            body["project"] = self.project
        return body

    @property
    def key(self) -> tuple[str | None, str]:
        return (self.project, self.run_name)


@dataclass(frozen=True)
class SpoolEntry:
    """One spooled batch. `path` is set for entries read from or written to disk."""

    run: RunIdentity
    kind: Kind
    body: Mapping[str, Any]
    created_at: float = field(default_factory=time.time)
    path: Path | None = None

    @property
    def batch_id(self) -> str:
        return str(self.body["batch_id"])

    def body_bytes(self) -> bytes:
        """The ingest body as compact JSON (non-finite floats are already strings in `body`)."""
        return json.dumps(self.body, separators=(",", ":")).encode()

    def size(self) -> int:
        """Bytes on disk (0 if not on disk or gone)."""
        if self.path is None:
            return 0
        try:
            return self.path.stat().st_size
        except OSError:
            return 0


@dataclass(frozen=True)
class WriteReport:
    """Result of `write_entry`. `kept` is False if the new entry itself was over the limit."""

    entry: SpoolEntry
    kept: bool
    dropped_batches: int = 0
    dropped_bytes: int = 0


@dataclass(frozen=True)
class ReplayReport:
    """Result of `replay`.

    Attributes:
        sent: entries the transport acknowledged ("ok"), now deleted.
        rejected: entries the service refused ("reject"), moved to `rejected/`.
        corrupt: unreadable files, moved to `corrupt/`.
        remaining: entries still in the directory after the replay.
        stopped: True if the replay stopped early (a "retry", an exception or `should_stop`).
        error: text of an exception raised by the transport, if any.
    """

    sent: int = 0
    rejected: int = 0
    corrupt: int = 0
    remaining: int = 0
    stopped: bool = False
    error: str | None = None


def outcome_for_status(status: int) -> Outcome:
    """How a replay treats an HTTP status of the ingest or register endpoints.

    2xx: ok. 401/403 (token), 404 (run unknown), 408, 409, 429 and 5xx: retry later (keep the
    batch: the batch itself is fine). Any other 4xx (400, 413, 422, ...): the batch is invalid and
    will never be accepted: reject.
    """
    if 200 <= status < 300:
        return "ok"
    if status in (401, 403, 404, 408, 409, 429) or status >= 500 or status < 200:
        return "retry"
    return "reject"


# ---------------------------------------------------------------------------------------------- write


def write_entry(
    directory: Path | str, entry: SpoolEntry, *, max_bytes: int | None = None, order_ns: int | None = None
) -> WriteReport:
    """Write `entry` atomically into `directory`, then enforce `max_bytes`.

    `order_ns` places it among the other entries: when its oldest data was logged (wall-clock ns);
    None: now, i.e. as the newest entry. Raises OSError if the file cannot be written (disk full,
    permissions); never leaves a partial file.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = gzip.compress(_encode(entry), compresslevel=6, mtime=0)
    with _lock:
        position = _next_ns() if order_ns is None else max(0, min(int(order_ns), 10**20 - 1))
        path = directory / f"{position:020d}-{_safe_id(entry.batch_id)}{SUFFIX}"
        _write_atomically(directory, path, data)
        written = dataclasses.replace(entry, path=path)
        if max_bytes is None:
            return WriteReport(written, kept=True)
        if len(data) > max_bytes:  # alone over the limit: drop it, keep the older entries
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return WriteReport(written, kept=False, dropped_batches=1, dropped_bytes=len(data))
        dropped, dropped_bytes = _enforce_limit(directory, max_bytes)
    return WriteReport(
        written, kept=path not in dropped, dropped_batches=len(dropped), dropped_bytes=dropped_bytes
    )


def _enforce_limit(directory: Path, max_bytes: int) -> tuple[set[Path], int]:
    files = [(p, _size(p)) for p in _entry_paths(directory)]
    total = sum(size for _, size in files)
    dropped: set[Path] = set()
    dropped_bytes = 0
    for path, size in files:  # oldest first
        if total <= max_bytes:
            break
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        total -= size
        dropped.add(path)
        dropped_bytes += size
    return dropped, dropped_bytes


def _next_ns() -> int:
    """Wall-clock ns, strictly increasing within the process (names sort oldest first)."""
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return _last_ns


def _safe_id(batch_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", batch_id)[:64] or "batch"


def _run_doc(run: RunIdentity) -> dict[str, Any]:
    return {
        "project": run.project,
        "run_name": run.run_name,
        "config": dict(run.config),
        "tags": list(run.tags),
    }


def _run_of(run: Any) -> RunIdentity:
    """The inverse of `_run_doc`; ValueError if `run` is not one."""
    if not isinstance(run, dict) or not isinstance(run.get("run_name"), str):
        raise ValueError("missing run identity")
    project, config, tags = run.get("project"), run.get("config") or {}, run.get("tags") or []
    if project is not None and not isinstance(project, str):
        raise ValueError("project must be a string")
    if not isinstance(config, dict) or not isinstance(tags, list):
        raise ValueError("config must be an object and tags a list")
    return RunIdentity(run_name=run["run_name"], project=project, config=config, tags=tuple(map(str, tags)))


def _encode(entry: SpoolEntry) -> bytes:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "kind": entry.kind,
        "created_at": entry.created_at,
        "run": _run_doc(entry.run),
        "body": dict(entry.body),
    }
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


# ----------------------------------------------------------------------------------------------- read


def _entry_paths(directory: Path) -> list[Path]:
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [directory / name for name in sorted(names) if _NAME_RE.match(name)]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def spool_size(directory: Path | str) -> tuple[int, int]:
    """(number of entries, total bytes) directly in `directory`."""
    paths = _entry_paths(Path(directory))
    return len(paths), sum(_size(p) for p in paths)


def read_entry(path: Path) -> SpoolEntry:
    """Decode one spool file; raises ValueError (or OSError) if it is not a valid entry."""
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()))
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a gzip JSON file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not an lldmon spool file")
    if doc.get("version") != VERSION:
        raise ValueError(f"unsupported spool version {doc.get('version')!r}")
    kind, body = doc.get("kind"), doc.get("body")
    if kind not in _KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    run = _run_of(doc.get("run"))
    if not isinstance(body, dict) or not isinstance(body.get("batch_id"), str):
        raise ValueError("missing body or batch_id")
    created_at = doc.get("created_at")
    return SpoolEntry(
        run=run,
        kind=kind,
        body=body,
        created_at=float(created_at) if isinstance(created_at, (int, float)) else 0.0,
        path=path,
    )


def _warn_corrupt(path: Path, error: Exception) -> None:
    log.warning("skipping unreadable spool file %s: %s", path, error)


def iter_entries(
    directory: Path | str, *, on_corrupt: Callable[[Path, Exception], None] | None = None
) -> Iterator[SpoolEntry]:
    """Entries of `directory`, oldest first (by file name). Never raises for a bad file.

    Unreadable files are skipped and reported to `on_corrupt(path, error)` (default: a warning on
    the `lldmon.spool` logger); files that vanish meanwhile (another replayer) are skipped silently.
    Subdirectories (`rejected/`, `corrupt/`) and temporary files are not listed.
    """
    report = on_corrupt or _warn_corrupt
    for path in _entry_paths(Path(directory)):
        try:
            entry = read_entry(path)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            report(path, exc)
            continue
        yield entry


def remove(entry: SpoolEntry) -> None:
    """Delete the entry's file (no error if it is already gone)."""
    if entry.path is not None:
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()


def move_to(path: Path, subdir: str, *, max_bytes: int | None = None) -> Path | None:
    """Move a spool file into `<its dir>/<subdir>/` (e.g. REJECTED_DIR); None if it was gone."""
    target_dir = path.parent / subdir
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / path.name
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None
    if max_bytes is not None:
        with _lock:
            _enforce_limit(target_dir, max_bytes)
    return target


def _sweep_stale_temp_files(directory: Path) -> None:
    """Remove temporary files a crashed writer left behind (older than an hour)."""
    cutoff = time.time() - _STALE_TMP_SECONDS
    try:
        names = [n for n in os.listdir(directory) if n.startswith(_TMP_PREFIX)]
    except OSError:
        return
    for name in names:
        path = directory / name
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:
                path.unlink()


# --------------------------------------------------------------------------------------------- replay


def replay(
    directory: Path | str,
    send: Callable[[SpoolEntry], Outcome],
    *,
    should_stop: Callable[[], bool] | None = None,
    rejected_max_bytes: int | None = None,
) -> ReplayReport:
    """Send the entries of `directory` oldest first through `send`.

    "ok": the entry is deleted. "reject": it is moved to `rejected/` (kept for inspection).
    "retry": the replay stops there (the entry stays, and so does everything newer), as it does when
    `send` raises or `should_stop()` becomes true. Corrupt files are moved to `corrupt/`.
    Never raises for a bad file or a failing transport.
    """
    directory = Path(directory)
    _sweep_stale_temp_files(directory)
    sent = rejected = 0
    corrupt: list[Path] = []
    stopped = False
    error: str | None = None

    def on_corrupt(path: Path, exc: Exception) -> None:
        _warn_corrupt(path, exc)
        corrupt.append(path)
        move_to(path, CORRUPT_DIR)

    for entry in iter_entries(directory, on_corrupt=on_corrupt):
        if should_stop is not None and should_stop():
            stopped = True
            break
        try:
            outcome = send(entry)
        except Exception as exc:  # a transport must not crash the replay
            outcome, error = "retry", f"{type(exc).__name__}: {exc}"
        if outcome == "ok":
            remove(entry)
            sent += 1
        elif outcome == "reject":
            if entry.path is not None:
                move_to(entry.path, REJECTED_DIR, max_bytes=rejected_max_bytes)
            rejected += 1
        else:
            stopped = True
            break
    remaining, _ = spool_size(directory)
    return ReplayReport(
        sent=sent, rejected=rejected, corrupt=len(corrupt), remaining=remaining, stopped=stopped, error=error
    )


def find_spool_dirs(root: Path | str) -> list[Path]:
    """`root` and every directory below it that holds spool entries or finish markers, or whose
    `rejected/` holds entries (not `rejected/`, `corrupt/` themselves)."""
    root = Path(root)
    found: list[Path] = []
    for current, dirs, _files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in (REJECTED_DIR, CORRUPT_DIR))
        path = Path(current)
        if _entry_paths(path) or _finish_paths(path) or _entry_paths(path / REJECTED_DIR):
            found.append(path)
    return found


# ------------------------------------------------------------------------------------ finish markers


def _finish_path(directory: Path, run: RunIdentity) -> Path:
    digest = hashlib.sha256(json.dumps([run.project, run.run_name]).encode()).hexdigest()[:16]
    return directory / f"finish-{digest}.json"


def _finish_paths(directory: Path) -> list[Path]:
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [directory / name for name in sorted(names) if _FINISH_RE.match(name)]


def write_finish(directory: Path | str, run: RunIdentity, status: str) -> Path:
    """Record (atomically) that `run` ended with `status`; replaces an earlier marker of that run."""
    if status not in FINISH_STATUSES:
        raise ValueError(f"status must be one of {list(FINISH_STATUSES)}, got {status!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    doc = {"format": FINISH_FORMAT, "version": VERSION, "status": status, "created_at": time.time()}
    data = json.dumps({**doc, "run": _run_doc(run)}, default=str).encode()
    path = _finish_path(directory, run)
    _write_atomically(directory, path, data)
    return path


def _write_atomically(directory: Path, path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: never a partial file."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=_TMP_PREFIX, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_finishes(directory: Path | str) -> list[tuple[Path, RunIdentity, str]]:
    """(path, run, status) of every finish marker in `directory`; unreadable ones are warned about."""
    out: list[tuple[Path, RunIdentity, str]] = []
    for path in _finish_paths(Path(directory)):
        try:
            doc = json.loads(path.read_bytes())
            if not isinstance(doc, dict) or doc.get("format") != FINISH_FORMAT:
                raise ValueError("not an lldmon finish marker")
            if doc.get("status") not in FINISH_STATUSES:
                raise ValueError(f"unknown status {doc.get('status')!r}")
            out.append((path, _run_of(doc.get("run")), str(doc["status"])))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            _warn_corrupt(path, exc)
    return out


def remove_finish(directory: Path | str, run: RunIdentity) -> None:
    """Delete `run`'s finish marker in `directory`, if any (the run is running again)."""
    with contextlib.suppress(FileNotFoundError):
        _finish_path(Path(directory), run).unlink()
