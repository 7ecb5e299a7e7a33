"""Prometheus metrics of the service itself, on an injected registry (tests get their own)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry, runs_by_status: Callable[[], dict[str, int]]) -> None:
        self.registry = registry
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
        registry.register(_RunsCollector(runs_by_status))

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


class _RunsCollector(Collector):
    """Runs by status, read from the database at scrape time (so every API process agrees)."""

    def __init__(self, runs_by_status: Callable[[], dict[str, int]]) -> None:
        self._runs_by_status = runs_by_status

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("lldmon_runs", "Runs by status.", labels=["status"])
        try:
            counts = self._runs_by_status()
        except Exception:  # the database being down must not break /metrics
            counts = {}
        for status, n in sorted(counts.items()):
            family.add_metric([status], n)
        yield family
