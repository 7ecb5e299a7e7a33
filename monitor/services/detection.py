"""Online detection after every ingested metrics batch: phases, alerts and the closed-loop directive.

Runs in its own transaction right after the batch's commit and before the acknowledgement, so the
directive returned to the trainer already reflects the new steps. The run row is locked for the
duration (see `store.detection.lock_run`), so concurrent batches of one run are processed in order.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

from contracts.metrics import CANONICAL_METRICS
from contracts.wire import encode_json
from monitor.alerting.rules import ActiveCondition, plan_alerts
from monitor.alerting.sinks import Dispatcher, Notification
from monitor.config import Settings
from monitor.detector import DetectorConfig, DetectorState, SeriesWindow, update
from monitor.domain import DirectiveInfo, Principal
from monitor.errors import InvalidInput, NotFound
from monitor.services.directive_policy import DirectiveRule, decide
from monitor.services.runs import RunService
from monitor.store import Database
from monitor.store import alerts as alert_store
from monitor.store import detection as detection_store
from monitor.store import events as event_store
from monitor.telemetry import ServiceMetrics

DETECTOR_INPUTS = CANONICAL_METRICS
"""Only canonical metrics are read for the detector (importers map trainer names onto them)."""


class DetectionService:
    def __init__(
        self,
        db: Database,
        runs: RunService,
        settings: Settings,
        telemetry: ServiceMetrics,
        dispatcher: Dispatcher,
    ) -> None:
        self.db = db
        self.runs = runs
        self.telemetry = telemetry
        self.dispatcher = dispatcher
        self.renotify_after = timedelta(seconds=settings.renotify_seconds)
        self.rule = DirectiveRule(
            trigger_phase=settings.llds_trigger_phase,
            lam=settings.llds_lambda,
            lam_max=settings.llds_lambda_max,
            escalate_after=settings.llds_escalate_after_steps,
        )

    def process(self, run_id: int) -> DirectiveInfo:
        """Judge the run's steps after the last one judged; returns the directive in force afterwards
        (read in the same transaction, so the acknowledgement needs no further round trip)."""
        start = time.perf_counter()
        notifications: list[Notification] = []
        with self.db.write() as conn:
            target = detection_store.lock_run(conn, run_id)
            if target is None:
                raise NotFound(f"run {run_id} does not exist")
            config = DetectorConfig().with_overrides(target.overrides)
            state = DetectorState.from_dict(target.state) if target.state else None
            step_min = None
            if state is not None and state.last_step is not None:
                step_min = max(0, state.last_step - config.required_history + 1)
            steps, values, present = detection_store.read_window(conn, run_id, DETECTOR_INPUTS, step_min)
            if len(steps) == 0 or (
                state is not None and state.last_step is not None and steps[-1] <= state.last_step
            ):
                return event_store.current_directive(conn, run_id)
            result = update(SeriesWindow(steps=steps, values=values, present=present), state, config)
            detection_store.save_state(conn, run_id, encode_json(result.state.to_dict()), result.state.phase)
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
            now = datetime.now(timezone.utc)
            # Episodes that started and already ended inside this batch (a lone NaN grad norm, say)
            # still open an alert; it resolves with the next batch.
            ongoing = {f.kind for f in result.findings}
            transient = [f for f in result.started if f.kind not in ongoing]
            active = [
                ActiveCondition(f.kind, f.severity, f.step, f.message, encode_json(f.evidence))
                for f in (*result.findings, *transient)
            ]
            plan = plan_alerts(
                alert_store.open_alerts(conn, run_id), active, now=now, renotify_after=self.renotify_after
            )
            for condition in plan.create:
                alert_id = alert_store.create(conn, run_id, condition, now)
                self.telemetry.record_alert(condition.severity, condition.kind)
                notifications.append(_notification("firing", alert_id, target, condition))
            for refresh in plan.refresh:
                alert_store.refresh(conn, refresh.alert_id, refresh.condition, now, refresh.notify)
                if refresh.notify:
                    notifications.append(_notification("firing", refresh.alert_id, target, refresh.condition))
            for alert in plan.resolve:
                alert_store.resolve(conn, alert.id, last_step, now)
                resolved = ActiveCondition(alert.kind, alert.severity, last_step, "condition cleared", {})
                notifications.append(_notification("resolved", alert.id, target, resolved))
            directive = event_store.current_directive(conn, run_id)
            change = decide(target.policy, result.state.phase, last_step, directive, self.rule)
            if change is not None:
                event_store.append_directive(
                    conn,
                    run_id,
                    llds_enabled=change.llds_enabled,
                    llds_lambda=change.llds_lambda,
                    reason=change.reason,
                    source="detector",
                    step=last_step,
                )
                directive = event_store.current_directive(conn, run_id)
        self.telemetry.detector_seconds.observe(time.perf_counter() - start)
        self.dispatcher.submit(notifications)
        return directive

    def set_overrides(self, principal: Principal, run_id: int, overrides: dict[str, Any]) -> dict[str, Any]:
        """Per-run detector settings; unknown names or bad types are rejected before anything is saved."""
        self.runs.get(principal, run_id)
        try:
            DetectorConfig().with_overrides(overrides)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(str(exc), field="overrides") from None
        with self.db.write() as conn:
            detection_store.set_overrides(conn, run_id, overrides)
        return overrides


def _notification(
    event: str, alert_id: int, target: detection_store.DetectionTarget, c: ActiveCondition
) -> Notification:
    return Notification(
        event=event,
        alert_id=alert_id,
        run_id=target.run_id,
        run_name=target.name,
        project=target.project,
        kind=c.kind,
        severity=c.severity,
        step=c.step,
        message=c.message,
        evidence=c.evidence,
    )
