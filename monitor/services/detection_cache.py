"""The detector windows a worker process keeps between passes, so a pass reads only the new steps.

A detector pass judges the new steps of a run on the `required_history` steps before them; re-reading
those from the database (some 240 steps x every canonical metric) was most of a pass's cost. After a
pass the window it used, cut to what the next pass needs, is kept here with the detector state the
pass saved (the JSON-safe dict written to `runs.detector_state`) and the run's overrides. The next
pass, holding the run's row lock, uses the window only if the stored state and overrides still equal
the cached ones: any other writer of the state (another worker or replica judged the run, its data
was cleared) or of the settings (overrides changed) makes it fall back to the full read.

A batch that writes at or below the last judged step changes history the window holds without
touching the state, so `IngestService` reports every batch (`DetectionService.history_written`) inside
its transaction, after it has locked the run's row; such a batch ingested by another process is not
seen here (see `monitor.services.detection`).

Bounded: at most `capacity` runs, least recently judged dropped first (about 100 kB a run with every
canonical metric).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from monitor.detector import SeriesWindow

CACHED_RUNS: Final = 512
"""Runs whose windows a process keeps: well above what one server follows (some 26 at one step/s)."""


@dataclass(frozen=True)
class CachedWindow:
    """What a pass left for the next one: its window from the next pass's first needed step on, and
    the state, overrides and history count it was judged with (the validity token)."""

    window: SeriesWindow
    state: dict[str, Any]
    overrides: dict[str, Any]
    history_rev: int


class WindowCache:
    """Run id -> `CachedWindow`, least recently used dropped beyond `capacity` (0: nothing kept).
    Thread-safe: the service judges several runs at once in worker threads."""

    def __init__(self, capacity: int = CACHED_RUNS) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[int, CachedWindow] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, run_id: int) -> bool:
        return run_id in self._entries

    def valid(
        self, run_id: int, state: dict[str, Any] | None, overrides: dict[str, Any], history_rev: int
    ) -> CachedWindow | None:
        """The run's cached window if it was cut for exactly this stored state, these overrides and
        this history count (read under the run's row lock), else None (and the stale entry is
        dropped)."""
        with self._lock:
            entry = self._entries.get(run_id)
            if entry is None:
                return None
            if entry.state != state or entry.overrides != overrides or entry.history_rev != history_rev:
                del self._entries[run_id]
                return None
            self._entries.move_to_end(run_id)
            return entry

    def put(self, run_id: int, entry: CachedWindow) -> None:
        """Keep `entry` for the run's next pass. Called under the run's row lock, before commit: if the
        commit fails, the stored state differs from `entry.state` and the entry is never used."""
        if self.capacity == 0:
            return
        with self._lock:
            self._entries[run_id] = entry
            self._entries.move_to_end(run_id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def forget(self, run_id: int) -> None:
        with self._lock:
            self._entries.pop(run_id, None)


def extend(cached: SeriesWindow, new: SeriesWindow) -> SeriesWindow:
    """`cached` followed by `new` (all of whose steps come later): what one read of both step ranges
    gives, NaN and not present where a metric has no row."""
    if len(new) == 0:
        return cached
    n_old, n_new = len(cached), len(new)
    values = {}
    present = {}
    for name in sorted(cached.values.keys() | new.values.keys()):
        old_v, new_v = cached.values.get(name), new.values.get(name)
        values[name] = np.concatenate(
            (
                np.full(n_old, np.nan) if old_v is None else old_v,
                np.full(n_new, np.nan) if new_v is None else new_v,
            )
        )
        old_p, new_p = cached.present.get(name), new.present.get(name)
        present[name] = np.concatenate(
            (
                np.zeros(n_old, dtype=bool) if old_p is None else old_p,
                np.zeros(n_new, dtype=bool) if new_p is None else new_p,
            )
        )
    return SeriesWindow(steps=np.concatenate((cached.steps, new.steps)), values=values, present=present)


def from_step(window: SeriesWindow, step_min: int) -> SeriesWindow:
    """The part of `window` at `step_min` and after, as a read of that range gives it (a metric with no
    row there left out), copied so the cache does not hold on to the larger arrays."""
    start = int(np.searchsorted(window.steps, step_min, side="left"))
    values = {}
    present = {}
    for name, mask in window.present.items():
        kept = mask[start:]
        if kept.any():
            present[name] = kept.copy()
            values[name] = window.values[name][start:].copy()
    return SeriesWindow(steps=window.steps[start:].copy(), values=values, present=present)
