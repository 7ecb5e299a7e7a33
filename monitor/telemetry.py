"""Prometheus metrics of the service, on an injected registry (tests get their own).

Label cardinality: per-run series exist only for *running* (or stalled) runs (`lldmon_run_phase`,
`lldmon_run_last_step_timestamp_seconds`), everything
else is labelled by small fixed sets (kind, outcome, severity, sink).

Under `lldmon serve --workers N` each worker process counts its own requests: with
PROMETHEUS_MULTIPROC_DIR set (monitor.serving sets it up) counters and histograms live in files there
and /metrics sums them over the workers, so a scrape that lands on another worker does not see the
counter jump back. The gauges are computed from the database at scrape time and need no aggregation.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from contracts.alerts import SEVERITIES
from monitor.detector.types import PHASES as DETECTOR_PHASES

PHASES = DETECTOR_PHASES


@dataclass(frozen=True)
class Snapshot:
    """Database-derived state, read at scrape time so every API process reports the same values."""

    runs_by_status: dict[str, int] = field(default_factory=dict)
    running_phases: list[tuple[int, str, str, str, datetime | None]] = field(default_factory=list)
    """(run id, project, run name, phase, last step time) of every running or stalled run."""
    open_alerts_by_severity: dict[str, int] = field(default_factory=dict)


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry, snapshot: Callable[[], Snapshot]) -> None:
        self.registry = registry
        shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if shared_dir:  # this process's values go to files; the registry reads every worker's
            MultiProcessCollector(registry, path=shared_dir)  # type: ignore[no-untyped-call]
            registry = CollectorRegistry()  # holds this process's metric objects, never exposed
        self.batches = Counter(
            "lldmon_ingest_batches",
            "Ingest batches by kind and outcome (stored, duplicate, rejected).",
            ["kind", "outcome"],
            registry=registry,
        )
        self.rows = Counter(
            "lldmon_ingest_rows", "Rows stored by ingest, by kind.", ["kind"], registry=registry
        )
        self.latency = Histogram(
            "lldmon_ingest_latency_seconds",
            "Time to validate-and-commit one batch (database transaction).",
            ["kind"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.detector_seconds = Histogram(
            "lldmon_detector_seconds",
            "Time to run the online detector over one ingested batch (lock, load window, update, persist).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
            registry=registry,
        )
        self.alerts = Counter(
            "lldmon_alerts_fired",
            "Alerts opened, by severity and kind.",
            ["severity", "kind"],
            registry=registry,
        )
        self.notifications = Counter(
            "lldmon_notifications",
            "Alert notifications by sink and outcome.",
            ["sink", "outcome"],
            registry=registry,
        )
        self.registry.register(_SnapshotCollector(snapshot))

    @contextlib.contextmanager
    def time_ingest(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.latency.labels(kind).observe(time.perf_counter() - start)

    def record_batch(self, kind: str, *, rows: int, duplicate: bool) -> None:
        self.batches.labels(kind, "duplicate" if duplicate else "stored").inc()
        if rows:
            self.rows.labels(kind).inc(rows)

    def record_rejected(self, kind: str) -> None:
        self.batches.labels(kind, "rejected").inc()

    def record_alert(self, severity: str, kind: str) -> None:
        self.alerts.labels(severity, kind).inc()

    def record_notification(self, sink: str, outcome: str) -> None:
        self.notifications.labels(sink, outcome).inc()


class _SnapshotCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[GaugeMetricFamily]:
        try:
            snap = self._snapshot()
        except Exception:  # the database being down must not break /metrics
            snap = Snapshot()
        runs = GaugeMetricFamily("lldmon_runs", "Runs by status.", labels=["status"])
        for status, n in sorted(snap.runs_by_status.items()):
            runs.add_metric([status], n)
        yield runs
        phase = GaugeMetricFamily(
            "lldmon_run_phase",
            "1 for the current LLD phase of each running (or stalled) run.",
            labels=["run_id", "project", "run", "phase"],
        )
        last_step = GaugeMetricFamily(
            "lldmon_run_last_step_timestamp_seconds",
            "Unix time at which each running (or stalled) run last sent a new step.",
            labels=["project", "run"],
        )
        for run_id, project, name, current, last_step_at in snap.running_phases:
            phase.add_metric([str(run_id), project, name, current], 1)
            if last_step_at is not None:
                last_step.add_metric([project, name], last_step_at.timestamp())
        yield phase
        yield last_step
        open_alerts = GaugeMetricFamily("lldmon_alerts_open", "Open alerts by severity.", labels=["severity"])
        for severity in SEVERITIES:
            open_alerts.add_metric([severity], snap.open_alerts_by_severity.get(severity, 0))
        yield open_alerts
