"""Warn once per distinct problem: a training loop calls the client thousands of times."""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable

logger = logging.getLogger("lldmon.client")


class WarnOnce:
    """`warn(key, msg, *args)` logs a WARNING on `lldmon.client` the first time `key` is seen."""

    def __init__(self, log: logging.Logger = logger, max_keys: int = 10_000) -> None:
        self._log = log
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()
        self._max_keys = max_keys

    def __call__(self, key: Hashable, msg: str, *args: object) -> bool:
        """Log `msg % args` unless `key` was logged before; True if it was logged now."""
        try:
            with self._lock:
                if key in self._seen or len(self._seen) >= self._max_keys:
                    return False
                self._seen.add(key)
            self._log.warning(msg, *args)
            return True
        except Exception:  # logging must never break the caller
            return False
