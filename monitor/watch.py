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
  bytes, the step counter it started from and how often the file was found rewritten. A re-sent chunk
  is therefore a duplicate on the service's batch ledger, never a second copy and never a 409.
- A record the service refuses (422) never takes the rest of its chunk with it: the refused batch is
  halved (steps, then the names of one step) until each refused value stands alone; every other part
  is stored, each refusal is reported with file:line and the service's reason, and only then does the
  offset move past the chunk. The halves have ids derived from their parent's, so a watcher stopped
  halfway re-sends the same parts (duplicates) after a restart.
- Rotation: when the path names another file (renamed and recreated) the old file is drained first
  (its last line even without a newline) and the new one is read from its start; a watcher that was
  down during a rotation finds the old file by its inode next to the path.
- Rewriting in place (copytruncate, or delete and recreate on a reused inode) keeps the identity and
  may regrow past the offset, so size alone cannot tell. The state therefore holds a digest of the
  last `ANCHOR_BYTES` read before the offset (the anchor), checked against the file on every read;
  a mismatch means the content before the offset changed: a copy next to the path whose bytes match
  the anchor (copytruncate's) is drained from the offset first, then the file is read from its start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Final

import httpx

from contracts import split
from lldmon_client import Reply, RetryPolicy, Session, Uploader, metrics_body, stable_batch_id
from lldmon_client.answers import not_an_api_message
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
ANCHOR_BYTES: Final = 4096
"""The bytes before the offset whose digest tells the file read so far from a rewritten one."""
STATE_VERSION: Final = 2
"""2 added the anchor and the rewrite count; a version 1 state (no anchor) is resumed unchecked."""
_BATCH_NAMESPACE: Final = "lldmon:watch-chunk"

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
    rewrites: int = 0
    """`WatchState.rewrites` when the chunk was read (part of its batch id)."""


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
    anchor_len: int = 0
    anchor: str | None = None
    """sha256 (hex) of the `anchor_len` bytes before `offset`; None (an older state): not checked."""
    rewrites: int = 0
    """How often the file was found rewritten in place: a chunk read again at the same place of the same
    inode after that is new content and gets a new batch id."""

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
            return cls(
                **{
                    **data,
                    "path": path,
                    "pending": Pending(**pending) if pending else None,
                    "version": STATE_VERSION,
                }
            )
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


def chunk_body(batch_id: str, records: dict[int, dict[str, float]]) -> dict[str, Any]:
    """The metrics body of a chunk's steps: steps ascending, names sorted (the same chunk always gives
    the same body)."""
    steps = sorted(records)
    names = sorted({name for row in records.values() for name in row})
    return metrics_body(batch_id, steps, {name: [records[s].get(name) for s in steps] for name in names})


def chunk_batch_id(pending: Pending, data: bytes) -> str:
    """Stable for the same bytes at the same place of the same file (a re-send is a duplicate)."""
    digest = hashlib.sha256(data).hexdigest()
    key = f"{pending.dev}:{pending.ino}:{pending.start}-{pending.end}:{pending.trl_step}:{digest}"
    if pending.rewrites:
        key += f":r{pending.rewrites}"
    return stable_batch_id(_BATCH_NAMESPACE, key, prefix="w-")


def step_lines(fmt: str, lines: list[Line], path: str, trl_step: int) -> dict[int, list[int]]:
    """step -> the numbers of the lines that logged it (to name the lines of a refused value)."""
    out: dict[int, list[int]] = {}
    for line in lines:
        parsed = parse_chunk(fmt, [line], path, Diagnostics(), trl_step)
        trl_step = parsed.trl_step
        for step in parsed.records:
            out.setdefault(step, []).append(line.number)
    return out


def anchor_of(before: bytes) -> tuple[int, str]:
    """(length, sha256 hex) of the last `ANCHOR_BYTES` of the bytes read before an offset."""
    tail = before[-ANCHOR_BYTES:]
    return len(tail), hashlib.sha256(tail).hexdigest()


# ---------------------------------------------------------------------------------------------- service


@dataclass(frozen=True)
class Refusal:
    """A value the service refused on its own (the smallest part a refused batch could be cut to)."""

    steps: tuple[int, ...]
    names: tuple[str, ...]
    values: int
    reason: str


@dataclass
class Delivery:
    """What became of one metrics body: the steps and values the service has now (stored or already
    there), and the values it refused."""

    steps: set[int] = field(default_factory=set)
    values: int = 0
    refused: list[Refusal] = field(default_factory=list)


class Service:
    """The HTTP side: run registration, batches (`lldmon_client.Uploader`: split to the body limit,
    retried while the service is unreachable or busy), halved around what it refuses, finishing the
    run. Waits end early when `stop` is set. `sent`/`duplicates` count accepted requests, `refused`
    refused values."""

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
        self.session = Session(url, token=token, timeout=timeout, transport=transport)
        self.url, self.base_url = url.strip(), self.session.base_url
        self.run, self.project = run, project
        self.stop, self.echo = stop, echo
        self.uploader = Uploader(
            self.session,
            retry=RetryPolicy(attempts=None, backoff_base=0.25, backoff_max=backoff_max),
            pause=lambda seconds: not stop.wait(seconds),
            stopped=stop.is_set,
            on_retry=self._retrying,
        )
        self.run_id: int | None = None
        self.sent = self.duplicates = self.refused = 0

    def close(self) -> None:
        self.session.close()

    def _retrying(self, retry: int, reply: Reply) -> None:
        if retry % 10 == 0:
            problem = reply.error if reply.status is None else f"HTTP {reply.status}"
            self.echo(f"service not reachable ({problem}); retrying")

    def _request(self, what: str, method: str, path: str, body: dict[str, Any]) -> Reply | None:
        """The answer once it is a success; None if `stop` came first; WatchError for a refusal."""
        reply = self.uploader.request(method, path, json=body)
        if reply.transient and self.stop.is_set():
            return None
        if reply.response is not None and reply.data is None:  # not JSON: the dashboard, a proxy's page
            raise WatchError(not_an_api_message(self.url, self.base_url, reply.response))
        if reply.outcome != "ok":
            raise WatchError(f"{what}: {reply.describe()}")
        return reply

    def ensure_run(self) -> bool:
        """Register the run (get-or-create); False if stopped first."""
        if self.run_id is not None:
            return True
        body: dict[str, Any] = {"name": self.run}
        if self.project is not None:
            body["project"] = self.project
        reply = self._request(f"registering run {self.run!r}", "POST", "/runs", body)
        if reply is None:
            return False
        self.run_id = int(reply.data["id"])
        return True

    def send(self, body: dict[str, Any]) -> Delivery | None:
        """Deliver one metrics body; None if stopped first (nothing is known to be lost then: the
        caller keeps the chunk pending and sends the same body again).

        A part the service refuses (422, or a 413 for a part that cannot be cut) is halved, and each
        half sent on its own, until the refused values stand alone: one refused record never takes
        others with it. Halving costs about two requests per refused value and level, and none while
        nothing is refused. The halves' ids derive from the parent's (`split.part_id`), so the same
        body halves the same way into the same ids again."""
        if not self.ensure_run():
            return None
        assert self.run_id is not None
        delivery = Delivery()
        queue = [body]
        while queue:
            outcome = self.uploader.send(self.run_id, "metrics", queue.pop(0))
            for sent in outcome.delivered:
                if sent.duplicate:
                    self.duplicates += 1
                else:
                    self.sent += 1
                steps, values = _part_contents(sent.body)
                delivery.steps.update(steps)
                delivery.values += values
            if outcome.reply is not None:
                if outcome.reply.transient:  # retried until stopped
                    return None
                # 401/403/404/409: stop, keep the chunk
                raise WatchError(f"batch {outcome.unsent[0]['batch_id']}: {outcome.reply.describe()}")
            halves: list[dict[str, Any]] = []
            for refused in outcome.refused:
                if refused.reply.status not in (413, 422):  # a request the service cannot take at all
                    raise WatchError(f"batch {refused.body['batch_id']}: {refused.reply.describe()}")
                parts = _halves(refused.body)
                if len(parts) > 1:
                    halves += parts
                    continue
                steps, values = _part_contents(refused.body)  # this value can never be accepted
                delivery.refused.append(
                    Refusal(tuple(steps), tuple(refused.body["metrics"]), values, refused.reply.describe())
                )
                self.refused += values
            queue[:0] = halves
        return delivery

    def finish(self) -> bool:
        if not self.ensure_run():
            return False
        path = f"/runs/{self.run_id}/finish"
        return (
            self._request(f"marking run {self.run!r} {FINISHED}", "POST", path, {"status": FINISHED})
            is not None
        )


def _halves(part: dict[str, Any]) -> list[dict[str, Any]]:
    """A refused part cut in two (by steps, else by names), each without the names and steps it has no
    value of; [] parts without any value are left out."""
    size = len(split.encode_compact(part))
    return [_pruned(p) for p, _ in split.split_body("metrics", part, size - 1) if _part_contents(p)[1]]


def _pruned(part: dict[str, Any]) -> dict[str, Any]:
    """A split part without the names and steps it has no value of, encoded. Slices keep every name of
    their parent, and a name the service refuses is refused even with no value: left in, it would follow
    every half down to single values. The service's ledger digests only the values, so this changes no
    batch's identity."""
    metrics = {name: col for name, col in part["metrics"].items() if any(v is not None for v in col)}
    keep = [i for i in range(len(part["steps"])) if any(col[i] is not None for col in metrics.values())]
    return {
        "batch_id": part["batch_id"],
        "steps": [part["steps"][i] for i in keep],
        "metrics": {name: [col[i] for i in keep] for name, col in metrics.items()},
    }


def _part_contents(part: dict[str, Any]) -> tuple[list[int], int]:
    """(the steps with a value, the number of values) of a metrics body."""
    metrics = part["metrics"]
    steps = [s for i, s in enumerate(part["steps"]) if any(col[i] is not None for col in metrics.values())]
    return steps, sum(v is not None for col in metrics.values() for v in col)


# ---------------------------------------------------------------------------------------------- follower


@dataclass
class Summary:
    steps: int = 0
    """Steps the service has a value of now, from this watch (stored, or already there)."""
    batches: int = 0
    """Requests the service accepted (`duplicates` of them already there)."""
    duplicates: int = 0
    refused: int = 0
    """Values the service refused (each reported with its file:line)."""
    idle: bool = False
    """Ended by `--until-idle` (not by a signal)."""


EMPTY_ANCHOR: Final = anchor_of(b"")[1]


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


def _find_by_anchor(path: Path, state: WatchState) -> Path | None:
    """A file next to `path`, other than the one the state names, whose bytes before the offset are
    the ones read there (copytruncate's copy of a log that was then truncated in place)."""
    if state.anchor is None or state.offset == 0:
        return None
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if not entry.is_file() or _identity(entry.stat()) == (state.dev, state.ino):
                    continue
                if entry.stat().st_size < state.offset:
                    continue
                with open(entry.path, "rb") as handle:
                    if _anchored(state, _read_before(handle, state.offset, state.anchor_len)):
                        return Path(entry.path)
    return None


def _anchored(state: WatchState, before: bytes) -> bool:
    """Whether `before` (read just before the offset) is what was read there (unknown: yes)."""
    return state.anchor is None or anchor_of(before) == (state.anchor_len, state.anchor)


def _read_before(handle: IO[bytes], offset: int, length: int) -> bytes:
    """The `length` bytes ending at `offset` (fewer if the file is shorter); leaves the handle there."""
    start = max(0, offset - length)
    handle.seek(start)
    return handle.read(offset - start)


def _read_whole_lines(handle: IO[bytes], offset: int, before: int = 0) -> tuple[bytes, bytes]:
    """The `before` bytes ending at `offset` and, read with them, the bytes from `offset` up to the last
    newline (at most about `MAX_CHUNK_BYTES`, more only for one longer line; b"" while no complete line
    is there). One read of both, so the bytes checked against the anchor are the ones sent after it."""
    before = min(before, offset)
    handle.seek(offset - before)
    data = b""
    while True:
        block = handle.read(MAX_CHUNK_BYTES)
        data += block
        if not block:
            return data[:before], b""
        cut = data.rfind(b"\n", before)
        if cut >= 0:
            return data[:before], data[before : cut + 1]


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
        self.summary.batches = self.service.sent + self.service.duplicates
        self.summary.duplicates = self.service.duplicates
        self.summary.refused = self.service.refused
        return self.summary

    def _step(self) -> bool:
        """Read and send the next chunk, or follow a rotation; True if anything was consumed."""
        if self._handle is None:
            return self._open_current()
        if self.state.format is None and not self._detect():
            return False
        before, data = _read_whole_lines(self._handle, self.state.offset, self.state.anchor_len)
        if not _anchored(self.state, before):
            self._rewritten("")
            return True
        if data:
            return self._begin(data, before)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # renamed away, its successor not created yet: the old one may still grow
        if _identity(st) != (self.state.dev, self.state.ino):
            self._drain_final()
            self._switch(st)
            return True
        if st.st_size < self.state.offset:  # a state without an anchor can only tell by the size
            self._rewritten("")
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
            before = _read_before(self._handle, state.offset, state.anchor_len)
            if st.st_size < state.offset or not _anchored(state, before):
                self._rewritten(" while not watched")
            return True
        assert state.ino is not None
        old = _find_by_identity(self.path, state.dev, state.ino)
        if old is not None:
            handle = open(old, "rb")  # noqa: SIM115
            if _anchored(state, _read_before(handle, state.offset, state.anchor_len)):
                self.echo(f"{self.path} was rotated while not watched: finishing {old.name} first")
                self._handle = handle
                return True  # `_step` drains it, then switches to the path
            handle.close()  # another file on the inode the old one had
        self.echo(
            f"warning: {self.path} was replaced while not watched and the file it was is gone: "
            f"lines after byte {state.offset} of it are lost; reading the new file from its start"
        )
        self._save(self._at_start(state, dev=None, ino=None))
        return True

    def _at_start(self, state: WatchState, **changes: Any) -> WatchState:
        """`state` at the start of a file (nothing of it read, nothing pending)."""
        return replace(state, offset=0, line=0, anchor_len=0, anchor=EMPTY_ANCHOR, pending=None, **changes)

    def _rewritten(self, when: str) -> None:
        """The bytes before the offset are not the ones read there: the file was truncated or written
        again in place. A copy of it next to the path (copytruncate) is finished from the offset first;
        then the file is read from its start. Counted in `rewrites`, so its chunks get new batch ids even
        where the same inode has the same bytes at the same place again."""
        assert self._handle is not None
        state = replace(self.state, rewrites=self.state.rewrites + 1, pending=None)
        try:
            on_path = _identity(os.stat(self.path)) == (state.dev, state.ino)
        except OSError:
            on_path = False
        if not on_path:  # a rotated-away file being finished was written again: leave it
            self.echo(f"warning: the rotated file changed after byte {state.offset}: following {self.path}")
            self._handle.close()
            self._handle = None
            self._save(self._at_start(state, dev=None, ino=None))
            return
        copy = _find_by_anchor(self.path, state)
        if copy is not None:
            self.echo(
                f"{self.path} was truncated or rewritten{when}: finishing its copy {copy.name} from byte "
                f"{state.offset}, then reading it again from its start"
            )
            self._handle.close()
            self._handle = open(copy, "rb")  # noqa: SIM115 - closed at the end of run()
            st = os.fstat(self._handle.fileno())
            self._save(replace(state, dev=st.st_dev, ino=st.st_ino))
            return  # `_step` drains it, then switches to the path
        if state.offset:
            self.echo(f"{self.path} was truncated or rewritten{when}: reading it again from its start")
        self._save(self._at_start(state))

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
        state = self._at_start(self.state, dev=st.st_dev, ino=st.st_ino)
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
        offset, line, trl_step, tail = 0, 0, state.trl_step, b""
        while data := _read_whole_lines(self._handle, offset)[1]:
            lines = chunk_lines(data, line)
            if state.format == TRL_LOG:
                trl_step = parse_chunk(TRL_LOG, lines, str(self.path), Diagnostics(), trl_step).trl_step
            offset, line = offset + len(data), line + len(lines)
            tail = (tail + data[-ANCHOR_BYTES:])[-ANCHOR_BYTES:]
        if offset:
            self.echo(f"skipping the {line} lines already in {self.path} (--from-start sends them)")
        anchor_len, anchor = anchor_of(tail)
        return replace(
            state, offset=offset, line=line, trl_step=trl_step, anchor_len=anchor_len, anchor=anchor
        )

    def _drain_final(self) -> None:
        """The rest of a file that was rotated away, its last line even without a newline."""
        assert self._handle is not None
        while True:
            before, data = _read_whole_lines(self._handle, self.state.offset, self.state.anchor_len)
            if not _anchored(self.state, before):
                self.echo(
                    f"warning: the rotated file changed after byte {self.state.offset}: not finishing it"
                )
                return
            if not data:
                break
            if not self._begin(data, before) or self.stop.is_set():
                return
        before = _read_before(self._handle, self.state.offset, self.state.anchor_len)
        tail = self._handle.read()
        if tail and not self.stop.is_set():
            self._begin(tail, before, final=True)

    def _switch(self, st: os.stat_result) -> None:
        if self.stop.is_set() or self.state.pending is not None:
            return
        assert self._handle is not None
        self._handle.close()
        self._handle = None
        self.echo(f"{self.path} was rotated: following the new file")
        self._save(self._at_start(self.state, dev=None, ino=None))
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

    def _begin(self, data: bytes, before: bytes, final: bool = False) -> bool:
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
            self.state.rewrites,
        )
        self._save(replace(self.state, pending=pending))
        return self._deliver(pending, (before, data))

    def _deliver(self, pending: Pending, read: tuple[bytes, bytes] | None = None) -> bool:
        """Parse and send a pending chunk (`read`: the bytes before it and its bytes), then commit the
        state past it; False if stopped first. Past it means each of its values is stored or was
        refused on its own (and reported)."""
        assert self.state.format is not None
        if read is None:
            read = self._reread(pending)
            if read is None:
                self.echo(f"warning: the chunk at bytes {pending.start}-{pending.end} is gone; skipping it")
                self._save(replace(self.state, pending=None))
                return True
        before, data = read
        lines = chunk_lines(data, pending.line, final=pending.final)
        diagnostics = Diagnostics()
        parsed = parse_chunk(self.state.format, lines, str(self.path), diagnostics, pending.trl_step)
        for item in diagnostics.items:
            self.echo(f"warning: {item}")
        if parsed.records:
            delivery = self.service.send(chunk_body(chunk_batch_id(pending, data), parsed.records))
            if delivery is None:
                return False
            self._report(delivery, lines, pending)
        anchor_len, anchor = anchor_of(before + data[-ANCHOR_BYTES:])
        self._save(
            replace(
                self.state,
                offset=pending.end,
                line=pending.line + len(lines),
                trl_step=parsed.trl_step,
                pending=None,
                anchor_len=anchor_len,
                anchor=anchor,
            )
        )
        return True

    def _report(self, delivery: Delivery, lines: list[Line], pending: Pending) -> None:
        """What of a chunk the service has now, and each refused value with the line(s) it came from."""
        assert self.state.format is not None
        self.summary.steps += len(delivery.steps)
        if delivery.steps:
            self.echo(f"steps {min(delivery.steps)}-{max(delivery.steps)}: {delivery.values} values")
        if not delivery.refused:
            return
        where = step_lines(self.state.format, lines, str(self.path), pending.trl_step)
        for refusal in delivery.refused:
            names = ", ".join(n if n.isprintable() else ascii(n) for n in refusal.names)
            for step in refusal.steps:
                numbers = where.get(step, [])
                place = f"{self.path}:{numbers[0]}" if numbers else str(self.path)
                more = f" (step logged on {len(numbers)} lines)" if len(numbers) > 1 else ""
                self.echo(f"warning: {place}: step {step}: {names} refused: {refusal.reason}{more}")

    def _reread(self, pending: Pending) -> tuple[bytes, bytes] | None:
        """The bytes of a pending chunk after a restart (and the anchor's before it), from whichever file
        now has its identity and still has the bytes read before it."""
        for candidate in (self.path, _find_by_identity(self.path, pending.dev, pending.ino)):
            if candidate is None:
                continue
            with contextlib.suppress(OSError), open(candidate, "rb") as handle:
                if _identity(os.fstat(handle.fileno())) == (pending.dev, pending.ino):
                    before = _read_before(handle, pending.start, self.state.anchor_len)
                    data = handle.read(pending.end - pending.start)
                    if len(data) == pending.end - pending.start and _anchored(self.state, before):
                        return before, data
        return None

    def _save(self, state: WatchState) -> None:
        self.state = state
        state.save(self.state_path)
