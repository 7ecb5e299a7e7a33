"""`lldmon watch`: follow a growing training log and stream each new step to a (remote) service.

Formats: verl's file logger JSONL, verl's console log and TRL's stdout (`monitor.importers`: their line
parsers are used as they are, so a watched log yields what `lldmon import` of the finished file would,
under the same canonical names of `contracts.trainer_keys`).

Exactly once across restarts and rotation, without any support from the trainer:

- Only complete lines are read (a partial last line waits for its newline), in chunks of whole lines.
- A small state file records the file's identity (device, inode), the byte offset and line number read
  up to, TRL's step counter (its dicts carry no step) and the chunk being delivered (`pending`). The
  pending chunk is written *before* it is sent and cleared after the service acknowledged it, each
  write atomic (`os.replace`), so a watcher killed at any moment re-reads and re-sends exactly that
  byte range after a restart.
- A chunk's batch id is derived from what cannot change: file identity, byte range, a digest of the
  bytes and the step counter it started from. A re-sent chunk is therefore a duplicate on the service's
  batch ledger, never a second copy and never a 409.
- Rotation: when the path names another file (renamed and recreated) the old file is drained first
  (its last line even without a newline) and the new one is read from its start; a watcher that was
  down during a rotation finds the old file by its inode next to the path. A file truncated below the
  offset (copytruncate) is read again from its start.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Final

import httpx

from contracts import split
from contracts.wire import API_PREFIX, encode_float
from monitor.importers.detect import TRL_LOG, VERL_CONSOLE, VERL_JSONL, detect_format
from monitor.importers.reading import Diagnostics, Line, LogImportError
from monitor.importers.trl_stdout import parse_trl_lines
from monitor.importers.verl_console import parse_verl_lines
from monitor.importers.verl_jsonl import parse_verl_jsonl_lines

WATCH_FORMATS: Final = (VERL_JSONL, VERL_CONSOLE, TRL_LOG)
"""Formats written line by line while training runs (the others are written once or are binary)."""
AUTO: Final = "auto"
FINISHED: Final = "finished"
"""The final status `--finish` sets (one of `contracts.wire.RUN_STATUSES`)."""
MAX_CHUNK_BYTES: Final = 1 << 20
"""Whole lines read (and sent as one batch) at a time."""
STATE_VERSION: Final = 1
_BATCH_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "lldmon:watch-chunk")
_RETRY_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})

Echo = Callable[[str], None]


class WatchError(Exception):
    """A problem the watcher cannot get past by waiting (bad token, unknown format, refused run)."""


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True)
class Pending:
    """A chunk written down before it is sent: [start, end) bytes, from line `line` on, TRL counter
    `trl_step` before it, of the file `dev`/`ino`."""

    dev: int
    ino: int
    start: int
    end: int
    line: int
    trl_step: int
    final: bool = False
    """The last chunk of a rotated file: its last line may lack a newline."""


@dataclass(frozen=True)
class WatchState:
    """Where the watcher stands in the file: persisted after every acknowledged chunk."""

    path: str
    format: str | None = None
    dev: int | None = None
    ino: int | None = None
    offset: int = 0
    line: int = 0
    trl_step: int = 0
    """The step of TRL's last log dict (TRL prints none: the importer counts them)."""
    pending: Pending | None = None
    version: int = STATE_VERSION

    @classmethod
    def load(cls, file: Path, path: str) -> WatchState | None:
        """The saved state, or None if there is none (a corrupt file is an error, not a fresh start:
        starting over could send a file's steps again under new ids)."""
        try:
            data = json.loads(file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise WatchError(f"cannot read watch state {file}: {exc}; delete it to start over") from None
        try:
            pending = data.pop("pending", None)
            return cls(**{**data, "path": path, "pending": Pending(**pending) if pending else None})
        except TypeError as exc:
            raise WatchError(f"watch state {file} is not lldmon's: {exc}; delete it to start over") from None

    def save(self, file: Path) -> None:
        """Atomically (write, fsync, rename): a kill leaves the old or the new state, never a mix."""
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as handle:
            json.dump(asdict(self), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, file)


def state_file(state_dir: Path, path: Path, base_url: str, project: str | None, run: str) -> Path:
    """One state per (file, service, project, run): the same log watched into two runs keeps two."""
    key = json.dumps([os.fspath(path.resolve()), base_url, project, run])
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run)[:40]
    return state_dir / f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


# ---------------------------------------------------------------------------------------------- parsing


@dataclass
class Parsed:
    """A chunk's steps: step -> {canonical name: value}, and TRL's counter after it."""

    records: dict[int, dict[str, float]] = field(default_factory=dict)
    trl_step: int = 0


def chunk_lines(data: bytes, first_line: int, final: bool = False) -> list[Line]:
    """The lines of a chunk of whole lines (the last may lack its newline only when `final`)."""
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    out = []
    for i, part in enumerate(raw):
        complete = not final or i < len(raw) - 1 or data.endswith(b"\n")
        out.append(Line(first_line + i + 1, part.decode("utf-8", errors="replace").rstrip("\r"), complete))
    return out


def parse_chunk(fmt: str, lines: list[Line], path: str, diagnostics: Diagnostics, trl_step: int) -> Parsed:
    """Steps of `lines` through the importer of `fmt`. TRL is parsed line by line so its step counter
    (the step of the last log dict) can be carried to the next chunk."""
    if fmt == TRL_LOG:
        parsed = Parsed(trl_step=trl_step)
        for line in lines:
            records = parse_trl_lines([line], path, diagnostics, first_step=parsed.trl_step + 1).to_records()
            for step, row in records.items():
                parsed.records.setdefault(step, {}).update(row)
            if records:  # the step of the line's last dict: its only one, or the highest
                parsed.trl_step = max(records)
        return parsed
    parse = parse_verl_jsonl_lines if fmt == VERL_JSONL else parse_verl_lines
    return Parsed(parse(lines, path, diagnostics).to_records(), trl_step)


def metrics_body(batch_id: str, records: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The columnar ingest body (`contracts.wire`), steps ascending, NaN/inf as their strings."""
    steps = sorted(records)
    names = sorted({name for row in records.values() for name in row})
    return {
        "batch_id": batch_id,
        "steps": steps,
        "metrics": {
            name: [encode_float(records[s][name]) if name in records[s] else None for s in steps]
            for name in names
        },
    }


def chunk_batch_id(pending: Pending, data: bytes) -> str:
    """Stable for the same bytes at the same place of the same file (a re-send is a duplicate)."""
    digest = hashlib.sha256(data).hexdigest()
    key = f"{pending.dev}:{pending.ino}:{pending.start}-{pending.end}:{pending.trl_step}:{digest}"
    return "w-" + uuid.uuid5(_BATCH_NAMESPACE, key).hex


# ---------------------------------------------------------------------------------------------- service


class Service:
    """The HTTP side: run registration, batches (split to the body limit, retried while the service is
    unreachable or busy), finishing the run. Waits end early when `stop` is set."""

    def __init__(
        self,
        url: str,
        run: str,
        project: str | None,
        token: str | None,
        stop: threading.Event,
        echo: Echo,
        timeout: float = 30.0,
        backoff_max: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = url.strip().rstrip("/").removesuffix(API_PREFIX) + API_PREFIX
        self.run, self.project = run, project
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )
        self.stop, self.echo, self.backoff_max = stop, echo, backoff_max
        self.max_bytes = split.DEFAULT_MAX_BODY_BYTES
        self.run_id: int | None = None
        self.sent = self.duplicates = self.refused = 0

    def close(self) -> None:
        self.http.close()

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response | None:
        """The response once it is not a transient failure; None if `stop` came first."""
        retry = 0
        while not self.stop.is_set():
            try:
                response = self.http.request(method, url, **kwargs)
            except httpx.TransportError as exc:
                problem, wait = f"{type(exc).__name__}: {exc}", None
            else:
                if response.status_code not in _RETRY_STATUSES:
                    return response
                problem = f"HTTP {response.status_code}"
                wait = _retry_after(response)
            delay = wait if wait is not None else min(self.backoff_max, 0.25 * 2.0 ** min(retry, 20))
            if retry == 0 or retry % 10 == 0:
                self.echo(f"service not reachable ({problem}); retrying")
            retry += 1
            self.stop.wait(delay)
        return None

    def ensure_run(self) -> bool:
        """Register the run (get-or-create); False if stopped first."""
        if self.run_id is not None:
            return True
        body: dict[str, Any] = {"name": self.run}
        if self.project is not None:
            body["project"] = self.project
        response = self._request("POST", "/runs", json=body)
        if response is None:
            return False
        if not response.is_success:
            raise WatchError(f"registering run {self.run!r}: {_describe(response)}")
        self.run_id = int(response.json()["id"])
        return True

    def send(self, body: dict[str, Any]) -> bool:
        """Deliver one metrics body (in parts if over the body limit); False if stopped first."""
        if not self.ensure_run():
            return False
        pending = split.split_body("metrics", body, self.max_bytes)
        while pending:
            part, raw = pending[0]
            response = self._request(
                "POST",
                f"/runs/{self.run_id}/metrics",
                content=gzip.compress(raw),
                headers={"content-type": "application/json", "content-encoding": "gzip"},
            )
            if response is None:
                return False
            if response.status_code == 413:
                limit = split.limit_from_error(response.text) or len(raw) // 2
                self.max_bytes = min(self.max_bytes, max(1024, limit))
                parts = split.split_body("metrics", part, self.max_bytes)
                if len(parts) > 1:
                    pending[:1] = parts
                    continue
            pending.pop(0)
            if response.is_success:
                if response.json().get("duplicate"):
                    self.duplicates += 1
                else:
                    self.sent += 1
            elif response.status_code in (401, 403, 404, 409):
                raise WatchError(f"batch {part['batch_id']}: {_describe(response)}")
            else:  # 422 and the like: this batch can never be accepted; the next ones can
                self.refused += 1
                self.echo(f"warning: batch {part['batch_id']} refused: {_describe(response)}")
        return True

    def finish(self) -> bool:
        if not self.ensure_run():
            return False
        response = self._request("POST", f"/runs/{self.run_id}/finish", json={"status": FINISHED})
        if response is None:
            return False
        if not response.is_success:
            raise WatchError(f"marking run {self.run!r} {FINISHED}: {_describe(response)}")
        return True


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return min(60.0, max(0.0, float(response.headers.get("retry-after", ""))))
    except ValueError:
        return None


def _describe(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    return f"HTTP {response.status_code} {str(detail)[:300]}"


# ---------------------------------------------------------------------------------------------- follower


@dataclass
class Summary:
    steps: int = 0
    batches: int = 0
    duplicates: int = 0
    refused: int = 0
    idle: bool = False
    """Ended by `--until-idle` (not by a signal)."""


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _find_by_identity(path: Path, dev: int, ino: int) -> Path | None:
    """A file next to `path` that is the one the state names (renamed by a rotation while no watcher ran)."""
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file() and _identity(entry.stat()) == (dev, ino):
                    return Path(entry.path)
    return None


def _read_whole_lines(handle: IO[bytes], offset: int) -> bytes:
    """Bytes from `offset` up to the last newline (at most about `MAX_CHUNK_BYTES`, more only for one
    longer line); b"" while no complete line is there."""
    handle.seek(offset)
    data = b""
    while True:
        block = handle.read(MAX_CHUNK_BYTES)
        if not block:
            return b""
        data += block
        cut = data.rfind(b"\n")
        if cut >= 0:
            return data[: cut + 1]


def _read_range(handle: IO[bytes], start: int, end: int) -> bytes:
    handle.seek(start)
    return handle.read(end - start)


class Watcher:
    """Follows one log file (see the module docstring). `run()` returns when `stop` is set or, with
    `until_idle`, after that many seconds without new lines."""

    def __init__(
        self,
        path: Path,
        service: Service,
        state_path: Path,
        *,
        fmt: str = AUTO,
        from_start: bool = False,
        until_idle: float | None = None,
        interval: float = 0.5,
        stop: threading.Event | None = None,
        echo: Echo = print,
    ) -> None:
        self.path, self.service, self.state_path = path, service, state_path
        self.fmt, self.from_start, self.until_idle, self.interval = fmt, from_start, until_idle, interval
        self.stop = stop or service.stop
        self.echo = echo
        self.summary = Summary()
        saved = WatchState.load(state_path, os.fspath(path))
        self.state = saved or WatchState(os.fspath(path), format=None if fmt == AUTO else fmt)
        self._skip_existing_lines = saved is None and not from_start and path.exists()
        """First watch of a log that is already there: follow it from its end, like `tail -f`."""
        if fmt != AUTO and self.state.format not in (None, fmt):
            raise WatchError(
                f"{path} was watched as {self.state.format}, not {fmt}; delete {state_path} to start over"
            )
        self._handle: IO[bytes] | None = None

    # -- main loop

    def run(self) -> Summary:
        last_growth = time.monotonic()
        try:
            if not self._open_at_start():
                return self.summary
            while not self.stop.is_set():
                if self.state.pending is not None and not self._deliver(self.state.pending):
                    break
                progressed = self._step()
                if progressed:
                    last_growth = time.monotonic()
                    continue
                if self.until_idle is not None and time.monotonic() - last_growth >= self.until_idle:
                    self.summary.idle = True
                    break
                self.stop.wait(self.interval)
        finally:
            if self._handle is not None:
                self._handle.close()
        self.summary.duplicates = self.service.duplicates
        self.summary.refused = self.service.refused
        return self.summary

    def _step(self) -> bool:
        """Read and send the next chunk, or follow a rotation; True if anything was consumed."""
        if self._handle is None:
            return self._open_current()
        if self.state.format is None and not self._detect():
            return False
        data = _read_whole_lines(self._handle, self.state.offset)
        if data:
            return self._begin(data)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # renamed away, its successor not created yet: the old one may still grow
        if _identity(st) != (self.state.dev, self.state.ino):
            self._drain_final()
            self._switch(st)
            return True
        if st.st_size < self.state.offset:
            self.echo(f"{self.path} was truncated: reading it again from its start")
            self._save(replace(self.state, offset=0, line=0))
            return True
        return False

    # -- files

    def _open_at_start(self) -> bool:
        """Open the file the state names (resuming), a rotated-away file it names, or the path."""
        state = self.state
        if state.dev is None:
            return True  # nothing read yet: `_open_current` when the path exists
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and _identity(st) == (state.dev, state.ino):
            self._handle = open(self.path, "rb")  # noqa: SIM115 - closed at the end of run()
            if st.st_size < state.offset:
                self.echo(f"{self.path} was truncated while not watched: reading it again from its start")
                self._save(replace(state, offset=0, line=0, pending=None))
            return True
        assert state.ino is not None
        old = _find_by_identity(self.path, state.dev, state.ino)
        if old is not None:
            self.echo(f"{self.path} was rotated while not watched: finishing {old.name} first")
            self._handle = open(old, "rb")  # noqa: SIM115
            return True  # `_step` drains it, then switches to the path
        self.echo(
            f"warning: {self.path} was replaced while not watched and the file it was is gone: "
            f"lines after byte {state.offset} of it are lost; reading the new file from its start"
        )
        self._save(replace(state, dev=None, ino=None, offset=0, line=0, pending=None))
        return True

    def _open_current(self) -> bool:
        """Start on the path once it exists: from its start, or (first watch without --from-start)
        from its last complete line, counting the TRL dicts skipped."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            raise WatchError(f"{self.path} is a directory, not a log file") from None
        st = os.fstat(handle.fileno())
        self._handle = handle
        state = replace(self.state, dev=st.st_dev, ino=st.st_ino, offset=0, line=0)
        if self._skip_existing_lines:
            self._skip_existing_lines = False
            self.state = state
            if self.state.format is None:
                self._detect()
            state = self._skip_existing(self.state)
        self._save(state)
        return True

    def _skip_existing(self, state: WatchState) -> WatchState:
        """State after the file's complete lines, as if they had been read (nothing is sent)."""
        assert self._handle is not None
        offset, line, trl_step = 0, 0, state.trl_step
        while data := _read_whole_lines(self._handle, offset):
            lines = chunk_lines(data, line)
            if state.format == TRL_LOG:
                trl_step = parse_chunk(TRL_LOG, lines, str(self.path), Diagnostics(), trl_step).trl_step
            offset, line = offset + len(data), line + len(lines)
        if offset:
            self.echo(f"skipping the {line} lines already in {self.path} (--from-start sends them)")
        return replace(state, offset=offset, line=line, trl_step=trl_step)

    def _drain_final(self) -> None:
        """The rest of a file that was rotated away, its last line even without a newline."""
        assert self._handle is not None
        while data := _read_whole_lines(self._handle, self.state.offset):
            if not self._begin(data) or self.stop.is_set():
                return
        self._handle.seek(self.state.offset)
        tail = self._handle.read()
        if tail and not self.stop.is_set():
            self._begin(tail, final=True)

    def _switch(self, st: os.stat_result) -> None:
        if self.stop.is_set() or self.state.pending is not None:
            return
        assert self._handle is not None
        self._handle.close()
        self._handle = None
        self.echo(f"{self.path} was rotated: following the new file")
        self._save(replace(self.state, dev=None, ino=None, offset=0, line=0))
        self._open_current()

    def _detect(self) -> bool:
        """`--format auto`: tell the format once the file shows it (a TRL log only by a dict with
        'epoch', since verl prints its config as dicts too)."""
        try:
            found = detect_format(self.path)
        except (LogImportError, OSError):
            return False
        if found not in WATCH_FORMATS:
            raise WatchError(
                f"{self.path} looks like {found}, which is not written line by line; "
                f"lldmon watch follows {', '.join(WATCH_FORMATS)} (pass --format, or use lldmon import)"
            )
        if found == TRL_LOG:
            with open(self.path, "rb") as handle:
                if b"'epoch':" not in handle.read(64 << 20):
                    return False
        self.state = replace(self.state, format=found)
        return True

    # -- chunks

    def _begin(self, data: bytes, final: bool = False) -> bool:
        """Write the chunk down as pending, then deliver it."""
        assert self.state.dev is not None and self.state.ino is not None
        end = self.state.offset + len(data)
        pending = Pending(
            self.state.dev,
            self.state.ino,
            self.state.offset,
            end,
            self.state.line,
            self.state.trl_step,
            final,
        )
        self._save(replace(self.state, pending=pending))
        return self._deliver(pending, data)

    def _deliver(self, pending: Pending, data: bytes | None = None) -> bool:
        """Parse and send a pending chunk, then commit the state past it; False if stopped first."""
        assert self.state.format is not None
        if data is None:
            data = self._reread(pending)
            if data is None:
                self.echo(f"warning: the chunk at bytes {pending.start}-{pending.end} is gone; skipping it")
                self._save(replace(self.state, pending=None))
                return True
        lines = chunk_lines(data, pending.line, final=pending.final)
        diagnostics = Diagnostics()
        parsed = parse_chunk(self.state.format, lines, str(self.path), diagnostics, pending.trl_step)
        for item in diagnostics.items:
            self.echo(f"warning: {item}")
        if parsed.records:
            body = metrics_body(chunk_batch_id(pending, data), parsed.records)
            if not self.service.send(body):
                return False
            steps = sorted(parsed.records)
            self.summary.steps += len(steps)
            self.summary.batches += 1
            self.echo(f"steps {steps[0]}-{steps[-1]}: {sum(map(len, parsed.records.values()))} values")
        self._save(
            replace(
                self.state,
                offset=pending.end,
                line=pending.line + len(lines),
                trl_step=parsed.trl_step,
                pending=None,
            )
        )
        return True

    def _reread(self, pending: Pending) -> bytes | None:
        """The bytes of a pending chunk after a restart, from whichever file now has its identity."""
        for candidate in (self.path, _find_by_identity(self.path, pending.dev, pending.ino)):
            if candidate is None:
                continue
            with contextlib.suppress(OSError), open(candidate, "rb") as handle:
                if _identity(os.fstat(handle.fileno())) == (pending.dev, pending.ino):
                    data = _read_range(handle, pending.start, pending.end)
                    if len(data) == pending.end - pending.start:
                        return data
        return None

    def _save(self, state: WatchState) -> None:
        self.state = state
        state.save(self.state_path)
