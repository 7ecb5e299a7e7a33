"""Monitoring never crashes training: a guarded part logs its first failure once and switches off."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Guard"]


class Guard:
    """`with guard(): ...` runs monitoring code; the first exception is logged once (with its
    traceback) and switches the guarded part off (`enabled` False) for the rest of the run."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.enabled = True
        self._log = log

    @contextmanager
    def __call__(self) -> Iterator[None]:
        try:
            yield
        except Exception:
            if self.enabled:
                self._log.warning(
                    "lldmon: %s failed; it is switched off for the rest of this run (training continues)",
                    self.what,
                    exc_info=True,
                )
            self.enabled = False
