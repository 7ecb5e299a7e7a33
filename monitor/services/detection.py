"""Online detection after every ingested metrics batch: phases, alerts and the closed-loop directive.
The detector judges; what its findings and phase changes mean for alerts and for the directive is
decided by `AlertService.judge` and `DirectiveService.apply_auto`, in the same transaction.

Runs right after the batch's commit and before the acknowledgement, so the directive returned to the
trainer already reflects the new steps. The new steps are judged in chunks of at most `chunk_points`,
one transaction each, with the run row locked (see `store.detection.lock_run`), so concurrent batches
of one run are processed in order; between chunks the lock (on SQLite the one write lock every run
shares) is released, so a huge batch does not hold up other runs' ingest. One call judges at most
`max_points`; a larger backlog is judged by the calls of the run's following batches (results do not
depend on how the steps are split: each step is judged on its own window).

Each worker process keeps the window of the runs it judged last (`detection_cache.WindowCache`), so a
pass reads only the steps after the last judged one; the window is used only while the run's stored
detector state, overrides and history count (`runs.history_rev`) are still the ones it was cut for, so
several workers or replicas on one database fall back to the full read whenever another one judged
the run or wrote into its judged history in between.
"""

from __future__ import annotations

import logging
import numbers
import sys
import time
from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import Connection

from contracts.metrics import CANONICAL_METRICS
from contracts.wire import ALERT_HEAL_EXHAUSTED, encode_json
from monitor.detector import DetectorConfig, DetectorState, SeriesWindow, update
from monitor.detector.findings import ALL_KINDS as DETECTOR_ALERT_KINDS
from monitor.domain import ActiveCondition, DirectiveInfo, Principal
from monitor.errors import InvalidInput, NotFound
from monitor.services.alerts import AlertRun, AlertService, Notifications
from monitor.services.detection_cache import CachedWindow, WindowCache, extend, from_step
from monitor.services.directives import AutoOutcome, DirectiveService
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import detection as detection_store
from monitor.store import events as event_store
from monitor.telemetry import ServiceMetrics

log = logging.getLogger("lldmon.detection")

DETECTOR_INPUTS = CANONICAL_METRICS
"""Only canonical metrics are read for the detector (importers map trainer names onto them), and the
run's declared reward series (`detector_inputs`)."""
CHUNK_POINTS: Final = 256
"""Steps judged per transaction: about 0.1 ms (one metric) to 2 ms (every canonical metric) each, so
one chunk holds the lock for some 30 ms to 0.5 s."""
MAX_POINTS: Final = 5000
"""Steps judged per call: every batch the client builds (5,000 steps at most) is judged at once."""


def detector_inputs(config: DetectorConfig) -> tuple[str, ...]:
    """The metrics read for a run's detector: the canonical ones and its `reward_metric` (a trainer's own
    series, say `rewards/exact_match/mean`, when the run declared one)."""
    if config.reward_metric in DETECTOR_INPUTS:
        return tuple(DETECTOR_INPUTS)
    return (*DETECTOR_INPUTS, config.reward_metric)


class DetectionService:
    def __init__(
        self,
        db: Database,
        runs: RunService,
        telemetry: ServiceMetrics,
        alerts: AlertService,
        directives: DirectiveService,
        windows: WindowCache | None = None,
    ) -> None:
        self.db = db
        self.runs = runs
        self.telemetry = telemetry
        self.alerts = alerts
        self.directives = directives
        self.windows = WindowCache() if windows is None else windows
        self.chunk_points = CHUNK_POINTS
        self.max_points = MAX_POINTS

    def process(self, run_id: int, *, catch_up: bool = False) -> DirectiveInfo:
        """Judge the run's steps after the last one judged, at most `max_points` of them (all of them
        with `catch_up`: an import's end, a run's finish), a chunk per transaction; returns the
        directive in force afterwards (read in the last chunk's transaction, so the acknowledgement
        needs no further round trip)."""
        start = time.perf_counter()
        budget = sys.maxsize if catch_up else self.max_points
        while True:
            n = max(1, min(self.chunk_points, budget))
            directive, more, notifications = self._process_chunk(run_id, n)
            self.alerts.notify(notifications)
            budget -= n
            if not more:
                break
            if budget <= 0:
                log.info("run %s: %d steps judged, the rest with its next batches", run_id, self.max_points)
                break
        self.telemetry.detector_seconds.observe(time.perf_counter() - start)
        return directive

    def _process_chunk(self, run_id: int, n: int) -> tuple[DirectiveInfo, bool, Notifications]:
        """Judge the next `n` new steps in one transaction: (directive, whether steps remain, what to
        notify once committed)."""
        notifications: Notifications = []
        with self.db.write() as conn:
            target = detection_store.lock_run(conn, run_id)
            if target is None:
                self.windows.forget(run_id)
                raise NotFound(f"run {run_id} does not exist")
            config = DetectorConfig().with_overrides(target.overrides)
            state = DetectorState.from_dict(target.state) if target.state else None
            step_min = None
            last_judged = state.last_step if state is not None else None
            if last_judged is not None:
                step_min = max(0, last_judged - config.required_history + 1)
            inputs = detector_inputs(config)
            step_max = self._chunk_end(conn, target, inputs, last_judged, n)
            window = self._window(conn, target, inputs, step_min, step_max, last_judged)
            steps = window.steps
            if len(steps) == 0 or (last_judged is not None and steps[-1] <= last_judged):
                return self.directives.in_force(conn, run_id), False, notifications
            result = update(window, state, config)
            saved = encode_json(result.state.to_dict())
            detection_store.save_state(conn, run_id, saved, result.state.phase)
            self._keep(target, window, saved, config)
            for phase_change in result.phase_changes:
                event_store.insert_phase_event(
                    conn,
                    run_id,
                    phase_change.step,
                    phase_change.phase,
                    phase_change.previous_phase,
                    encode_json(phase_change.evidence),
                )
            last_step = int(steps[-1])
            # Episodes that started and already ended inside this chunk (a lone NaN grad norm, say)
            # still open an alert; it resolves with the next chunk.
            ongoing = {f.kind for f in result.findings}
            transient = [f for f in result.started if f.kind not in ongoing]
            active = [
                ActiveCondition(
                    f.kind, f.severity, f.step, f.message, encode_json(f.evidence), _active_at(f.evidence)
                )
                for f in (*result.findings, *transient)
            ]
            notifications = self.alerts.judge(
                conn,
                AlertRun(target.run_id, target.name, target.project, result.state.phase),
                active,
                kinds=DETECTOR_ALERT_KINDS,
                last_step=last_step,
            )
            entered = [(c.phase, c.step) for c in result.phase_changes]
            outcome = self.directives.apply_auto(
                conn,
                run_id,
                target.policy,
                result.state.phase,
                last_step,
                entered,
                phase_since=result.state.phase_since,
            )
            if outcome.heal_exhausted is not None:
                notifications += self._heal_exhausted(conn, target, result.state.phase, last_step, outcome)
        return outcome.directive, step_max is not None, notifications

    def _heal_exhausted(
        self,
        conn: Connection,
        target: detection_store.DetectionTarget,
        phase: str,
        step: int,
        outcome: AutoOutcome,
    ) -> Notifications:
        """Open the critical that says `heal` gave up on the run (it stays open: no detector pass judges
        its kind)."""
        condition = ActiveCondition(
            ALERT_HEAL_EXHAUSTED,
            "critical",
            step,
            f"heal gave up and requested a stop: {outcome.heal_exhausted}",
            {"directive_version": outcome.directive.version},
        )
        return self.alerts.judge(
            conn,
            AlertRun(target.run_id, target.name, target.project, phase),
            [condition],
            kinds={ALERT_HEAL_EXHAUSTED},
            last_step=step,
            hysteresis=False,
        )

    def rewind(self, conn: Connection, run_id: int, to_step: int) -> None:
        """Put the run's detector back to where it stood after judging `to_step` (a rollback: the steps
        after it are being trained again), in the caller's transaction, which holds the run's lock.

        The state is recomputed by judging the stored steps up to `to_step` from scratch, which gives the
        state the online passes had there (online == offline); what that replay finds was recorded
        when those steps were first judged, so only the state is kept."""
        self.windows.forget(run_id)
        target = detection_store.lock_run(conn, run_id)
        if target is None:
            raise NotFound(f"run {run_id} does not exist")
        config = DetectorConfig().with_overrides(target.overrides)
        window = SeriesWindow(
            *detection_store.read_window(conn, run_id, detector_inputs(config), None, to_step)
        )
        if len(window.steps) == 0:
            detection_store.reset_state(conn, run_id)
            return
        state = update(window, None, config).state
        detection_store.save_state(conn, run_id, encode_json(state.to_dict()), state.phase)

    @staticmethod
    def _chunk_end(
        conn: Connection,
        target: detection_store.DetectionTarget,
        inputs: tuple[str, ...],
        last_judged: int | None,
        n: int,
    ) -> int | None:
        """Where a chunk of at most `n` new steps ends (None: at the run's last step). When the run's
        last step is at most `n` steps past the last judged one, no query is needed to know it."""
        if last_judged is not None and target.last_step is not None and target.last_step - last_judged <= n:
            return None
        return detection_store.chunk_end(conn, target.run_id, inputs, last_judged, n)

    def _window(
        self,
        conn: Connection,
        target: detection_store.DetectionTarget,
        inputs: tuple[str, ...],
        step_min: int | None,
        step_max: int | None,
        last_judged: int | None,
    ) -> SeriesWindow:
        """The window the next points are judged on, steps `step_min` to `step_max` (None: open): the
        cached window and the steps after `last_judged` when the cache holds the run's window for its
        stored state, else one read of the whole range."""
        cached = self.windows.valid(target.run_id, target.state, target.overrides, target.history_rev)
        if cached is not None and last_judged is not None:
            new = detection_store.read_window(conn, target.run_id, inputs, last_judged + 1, step_max)
            return extend(cached.window, SeriesWindow(*new))
        return SeriesWindow(*detection_store.read_window(conn, target.run_id, inputs, step_min, step_max))

    def _keep(
        self,
        target: detection_store.DetectionTarget,
        window: SeriesWindow,
        saved: dict[str, Any],
        config: DetectorConfig,
    ) -> None:
        """Cache what the run's next pass needs of `window`: its steps from `required_history` - 1
        before the last one judged on."""
        last_step = int(window.steps[-1])
        kept = from_step(window, max(0, last_step - config.required_history + 1))
        self.windows.put(target.run_id, CachedWindow(kept, saved, target.overrides, target.history_rev))

    def set_overrides(self, principal: Principal, run_id: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """Per-run detector settings; unknown names or bad types are rejected before anything is saved."""
        self.runs.get(principal, run_id)
        try:
            DetectorConfig().with_overrides(overrides)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(str(exc), field="overrides") from None
        with self.db.write() as conn:
            detection_store.set_overrides(conn, run_id, overrides)
        self.windows.forget(run_id)
        return overrides


def _active_at(evidence: Mapping[str, Any]) -> int | None:
    """The last step a finding was seen active (the detector's `evidence["active_at"]`), if it says."""
    value = evidence.get("active_at")
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
