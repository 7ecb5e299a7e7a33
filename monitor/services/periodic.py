"""Background upkeep of a server process (liveness sweeps, retention): one job every `interval` seconds
in a daemon thread, until `stop`. A failing pass is logged and retried at the next interval: upkeep must
never take the server down, nor stop for good after a database hiccup."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("lldmon.upkeep")


class Periodic:
    def __init__(
        self, name: str, job: Callable[[], object], interval: float, *, at_start: bool = False
    ) -> None:
        self.name = name
        self.job = job
        self.interval = interval
        self.at_start = at_start
        self.passes = 0
        """Passes finished, failed ones included (tests and operators can see the job is alive)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lldmon-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def run_once(self) -> bool:
        """One pass; False if it failed (logged)."""
        try:
            self.job()
        except Exception:
            log.exception("%s failed; retrying in %s s", self.name, self.interval)
            return False
        finally:
            self.passes += 1
        return True

    def _run(self) -> None:
        if self.at_start:
            self.run_once()
        while not self._stop.wait(self.interval):
            self.run_once()
