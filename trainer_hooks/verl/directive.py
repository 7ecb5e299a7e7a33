"""Switching LLDS at run time: the process-local override, the directive file that reaches verl's
worker processes (written by the driver, read by the loss), and their precedence over the config.
What reaches the workers and what cannot: docs/hooks-verl.md."""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from contracts.directive import DEFAULT_LLDS_LAMBDA, parse_directive
from trainer_hooks._warn import WarnOnce
from trainer_hooks.verl.config import LossSettings

__all__ = [
    "DirectiveFile",
    "LLDSSwitch",
    "directive_file_writer",
    "get_llds_override",
    "llds_from_directive",
    "set_llds_override",
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


def write_llds_directive(path: str | os.PathLike[str], enabled: bool, lam: float) -> None:
    """Atomically write the LLDS switch that `llds_directive_file` readers pick up."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    body = json.dumps({"llds": {"enabled": bool(enabled), "lam": float(lam)}})
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


def directive_file_writer(path: str | os.PathLike[str]) -> Callable[[Any], None]:
    """An `on_directive` callback for `attach`: writes each new directive's LLDS switch to `path`."""

    def write(directive: Any) -> None:
        parsed = llds_from_directive(directive)
        if parsed is not None:
            write_llds_directive(path, *parsed)

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
