"""The one line on stderr that tells a training job's log whether lldmon monitors it.

A plain training script configures no logging, so a message on a logger is easily never shown; a
job that is not monitored (no `LLDMON_URL`, a misspelled variable) must still say so where its log
goes. The line is printed once per process and subject, on rank 0 only (other ranks never send).
"""

from __future__ import annotations

import difflib
import os
import sys
import threading
from collections.abc import Hashable, Mapping

__all__ = ["close_env_names", "is_rank_zero", "say_once", "unset_note"]

_CLOSE_CUTOFF = 0.85
"""difflib ratio above which a variable looks like a misspelling: LLDMON_ULR, LDMON_URL, LLDMON_URI
and lldmon_url pass (0.9 and above); LLDMON_RUN (0.8) and LLDMON_PUBLIC_URL (0.74) do not."""

_lock = threading.Lock()
_said: set[Hashable] = set()


def is_rank_zero(environ: Mapping[str, str] | None = None) -> bool:
    """True unless RANK or LOCAL_RANK names a process other than the first."""
    env = os.environ if environ is None else environ
    return all(env.get(var, "0").strip() in ("", "0") for var in ("RANK", "LOCAL_RANK"))


def say_once(key: Hashable, line: str) -> bool:
    """Print `line` on stderr unless a line with `key` was printed in this process; never raises."""
    with _lock:
        if key in _said:
            return False
        _said.add(key)
    try:
        print(line, file=sys.stderr, flush=True)
    except Exception:  # a closed or broken stderr must not reach the training loop
        return False
    return True


def close_env_names(name: str, environ: Mapping[str, str]) -> list[str]:
    """Variables of `environ` other than `name` that look like a misspelling of it (case ignored)."""
    by_upper: dict[str, str] = {}
    for key in environ:
        if key != name:
            by_upper.setdefault(key.upper(), key)
    return [by_upper[m] for m in difflib.get_close_matches(name.upper(), list(by_upper), 3, _CLOSE_CUTOFF)]


def unset_note(name: str, environ: Mapping[str, str]) -> str:
    """'NAME is not set', naming the variables that look like it, if any."""
    close = close_env_names(name, environ)
    if not close:
        return f"{name} is not set"
    verb = "is" if len(close) == 1 else "are"
    return f"{name} is not set, but {', '.join(close)} {verb} (did you mean {name}?)"
