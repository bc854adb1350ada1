"""The service's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.pool import QueuePool

REGISTRY = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "blkpilot_http_requests",
    "HTTP requests handled, by route template, method and status code.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "blkpilot_http_request_duration_seconds",
    "Time from request received to response sent, by route template and method.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
TELEMETRY_BATCHES = Counter(
    "blkpilot_telemetry_batches",
    "Telemetry batches by outcome: accepted (stored), duplicate (seen before), rejected.",
    ["outcome"],
    registry=REGISTRY,
)
TELEMETRY_WINDOWS = Counter(
    "blkpilot_telemetry_windows_ingested",
    "Telemetry windows stored (counted after their transaction committed).",
    registry=REGISTRY,
)


class DatabasePoolCollector(Collector):
    """Connection pool state, read at scrape time from the engine in use."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pool = self.engine.pool if self.engine is not None else None
        if not isinstance(pool, QueuePool):
            return
        yield GaugeMetricFamily(
            "blkpilot_db_pool_size", "Connections the pool keeps open.", value=pool.size()
        )
        yield GaugeMetricFamily(
            "blkpilot_db_pool_checked_out",
            "Connections in use by requests.",
            value=pool.checkedout(),
        )
        yield GaugeMetricFamily(
            "blkpilot_db_pool_checked_in", "Idle connections in the pool.", value=pool.checkedin()
        )
        yield GaugeMetricFamily(
            "blkpilot_db_pool_overflow",
            "Connections open beyond the pool size (negative: pool not yet full).",
            value=pool.overflow(),
        )


DB_POOL = DatabasePoolCollector()
REGISTRY.register(DB_POOL)
