"""Switching LLDS at run time: the process-local override, the directive file that reaches verl's
worker processes (written by the driver, read by the loss), and their precedence over the config.
What reaches the workers and what cannot: docs/hooks-verl.md.

The directive file also carries the service's checkpoint, stop and rollback requests. verl saves and
stops in its driver loop (`RayPPOTrainer.fit`), which lldmon does not patch; `DirectiveLevers` reads
them there, each request once, and acknowledges the directive through the metrics verl logs. Given the
step and verl's checkpoint folder, it hands a rollback request to `lldmon supervise`
(`trainer_hooks.verl.rollback`: run the job with `--resume-arg trainer.resume_mode=resume_path
--resume-arg 'trainer.resume_from_path={checkpoint}'`), which restarts the job from the checkpoint::

    levers = DirectiveLevers("/shared/lldmon/directive.json")    # the path given to directive_file_writer
    # in RayPPOTrainer.fit (a subclass or a copy), after a step's `metrics` are complete:
    todo = levers.take(step=self.global_steps, checkpoint_dir=self.config.trainer.default_local_dir)
    metrics.update(todo.metrics())            # {"directive/applied_version": v} when there is news
    if todo.checkpoint or todo.stop:
        self._save_checkpoint()
    logger.log(data=metrics, step=self.global_steps)
    if todo.stop or todo.rollback:
        return        # stop: saved, logged, done; rollback: the supervisor restarts the job from the checkpoint

The restarted job needs nothing more in the loop: the `Tracking` attachment logs
`directive/rollback_to` with its first step, lldmon's actor applies the learning-rate factor.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from contracts.directive import DEFAULT_LLDS_LAMBDA, Levers, LeverTracker, LLDSDirective, parse_directive
from trainer_hooks import rollback
from trainer_hooks._warn import WarnOnce
from trainer_hooks.verl.config import LossSettings
from trainer_hooks.verl.rollback import hand_over

__all__ = [
    "DirectiveFile",
    "DirectiveLevers",
    "LLDSSwitch",
    "directive_file_writer",
    "get_llds_override",
    "llds_from_directive",
    "set_llds_override",
    "write_directive",
    "write_llds_directive",
]

_override_lock = threading.Lock()
_override: tuple[bool, float | None] | None = None


def set_llds_override(enabled: bool | None, lam: float | None = None) -> None:
    """Override the config's LLDS switch in **this process** (None: back to the config).

    `enabled=True` with `lam=None` keeps the config's `llds_lambda` if it is > 0, else uses 0.2.
    verl runs the loss in Ray worker processes: calling this in the driver has no effect on
    training (docs/hooks-verl.md; use `llds_directive_file` to reach the workers).
    """
    global _override
    if lam is not None and (not math.isfinite(lam) or lam < 0):
        raise ValueError(f"lam must be finite and >= 0, got {lam!r}")
    with _override_lock:
        _override = None if enabled is None else (bool(enabled), None if lam is None else float(lam))


def get_llds_override() -> tuple[bool, float | None] | None:
    """The process-local override `(enabled, lam)` set by `set_llds_override`, or None."""
    with _override_lock:
        return _override


def llds_from_directive(directive: Any) -> tuple[bool, float] | None:
    """`(enabled, lam)` of a directive, or None if it has none or it is malformed.

    Accepts what `contracts.directive.parse_directive` accepts: a `Directive`, the service's JSON
    shape `{"llds": {"enabled": .., "lam": ..}, ...}`, or a flat `{"enabled": .., "lam": ..}`.
    """
    parsed = parse_directive(directive)
    return None if parsed is None else (parsed.llds.enabled, parsed.llds.lam)


def _write_atomically(path: str | os.PathLike[str], body: str) -> None:
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".lldmon-directive-", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(body)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; workers may run as another user
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_llds_directive(path: str | os.PathLike[str], enabled: bool, lam: float) -> None:
    """Atomically write the LLDS switch that `llds_directive_file` readers pick up."""
    _write_atomically(path, json.dumps({"llds": LLDSDirective(bool(enabled), float(lam)).to_wire()}))


def write_directive(path: str | os.PathLike[str], directive: Any) -> bool:
    """Atomically write the whole directive (LLDS switch, checkpoint and stop requests) to `path`;
    False (nothing written) if `directive` is malformed."""
    parsed = parse_directive(directive)
    if parsed is None:
        return False
    _write_atomically(path, json.dumps(parsed.to_wire()))
    return True


def directive_file_writer(path: str | os.PathLike[str]) -> Callable[[Any], None]:
    """An `on_directive` callback for `attach`: writes each new directive to `path` (its LLDS switch
    for `llds_directive_file` readers, its requests for `DirectiveLevers`)."""

    def write(directive: Any) -> None:
        write_directive(path, directive)

    return write


class DirectiveFile:
    """Reads `llds_directive_file` again only when it changed (inode, mtime, size); keeps the last
    good value while the file is malformed, forgets it when the file is removed."""

    def __init__(self) -> None:
        self._stamp: tuple[str, int, int, int] | None = None
        self._value: tuple[bool, float] | None = None

    def read(self, path: str, warn: WarnOnce) -> tuple[bool, float] | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._stamp, self._value = None, None
            return None
        except OSError as exc:  # e.g. a shared filesystem hiccup: keep the last switch
            warn(("directive-file-stat", path), "lldmon: cannot stat llds_directive_file %s: %s", path, exc)
            return self._value
        stamp = (path, st.st_ino, st.st_mtime_ns, st.st_size)  # os.replace gives a new inode
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                with open(path) as fh:
                    parsed = llds_from_directive(json.load(fh))
                if parsed is None:
                    raise ValueError('expected {"llds": {"enabled": <bool>, "lam": <number >= 0>}}')
                self._value = parsed
            except (OSError, ValueError) as exc:
                warn(("directive-file", path), "lldmon: ignoring llds_directive_file %s: %s", path, exc)
        return self._value


class DirectiveLevers:
    """The directive file's checkpoint, stop and rollback requests, for verl's driver loop (module
    docstring): `take()` returns each request once (`contracts.directive.LeverTracker`); a missing or
    malformed file means nothing to do (malformed: warned once)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._tracker = LeverTracker()
        self._warn = WarnOnce(logging.getLogger("lldmon.verl"))
        self._rollback_id = 0  # the rollback request id of the directive read last

    def take(self, step: int | None = None, checkpoint_dir: str | os.PathLike[str] | None = None) -> Levers:
        """What the loop should do after verl step `step`, each request once.

        With `step`, a rollback request is carried out (`trainer_hooks.verl.rollback.hand_over`):
        `rollback` set means the supervisor's request is written and the loop ends the run without
        saving (`rollback_to` is then the checkpoint's step); if no rollback is possible (no
        supervisor, no complete checkpoint at or before the step in `checkpoint_dir`, verl's
        `trainer.default_local_dir`), `stop` is set instead, with the reason. A stop request wins
        over a rollback. Without `step` the rollback request is returned as it is, for a caller that
        handles it itself. The rollback this job was restarted for is never returned again.
        """
        levers = rollback.pending(self._read(), self._rollback_id)
        if step is None or not levers.rollback:
            return levers
        return hand_over(levers, step=step, checkpoint_dir=checkpoint_dir, version=self._rollback_id)

    def _read(self) -> Levers:
        self._rollback_id = 0
        try:
            with open(self.path) as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return Levers()
        except (OSError, ValueError) as exc:
            self._warn(("levers", self.path), "lldmon: cannot read directive file %s: %s", self.path, exc)
            return Levers()
        parsed = parse_directive(data)
        if parsed is None:
            self._warn(("levers", self.path), "lldmon: ignoring malformed directive file %s", self.path)
            return Levers()
        self._rollback_id = parsed.rollback
        return self._tracker.take(parsed)


class LLDSSwitch:
    """The LLDS lambda in force at each loss call (0 = off), in order of precedence: the process
    override (`set_llds_override`) > `llds_directive_file` > the config's `llds_lambda`."""

    def __init__(self, warn: WarnOnce) -> None:
        self.warn = warn
        self.directive_file = DirectiveFile()

    def weight(self, settings: LossSettings) -> float:
        """The LLDS lambda in force now (0 = off)."""
        override = get_llds_override()
        if override is None and settings.llds_directive_file:
            override = self.directive_file.read(settings.llds_directive_file, self.warn)
        if override is None:
            return settings.llds_lambda
        enabled, lam = override
        if not enabled:
            return 0.0
        if lam is None:
            lam = settings.llds_lambda if settings.llds_lambda > 0 else DEFAULT_LLDS_LAMBDA
        return lam
