"""The metrics blkpilot measures and judges by: each one's label, unit and direction, defined
once — for the canary's statistics, the models' objectives, the service's recommendations and
the dashboard. A gain is always an improvement (higher is better): a latency 20 % lower is a
gain of +20 %."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    higher_is_better: bool

    def gain(self, relative_change: float) -> float:
        """The improvement a relative change is (candidate over baseline, minus one)."""
        return relative_change if self.higher_is_better else -relative_change


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("lat_p50_us", "p50 latency", "µs", higher_is_better=False),
        Metric("lat_p99_us", "p99 latency", "µs", higher_is_better=False),
        Metric("lat_mean_us", "mean latency", "µs", higher_is_better=False),
        Metric("iops", "IOPS", "I/O per s", higher_is_better=True),
        Metric("joules_per_mio", "energy per million I/Os", "J", higher_is_better=False),
        Metric(
            "joules_per_mio_estimated",
            "energy per million I/Os (estimated)",
            "J",
            higher_is_better=False,
        ),
        Metric("bytes_per_joule", "bytes per joule", "B/J", higher_is_better=True),
        Metric(
            "worst_slowdown_over_proportional",
            "fairness: worst slowdown over proportional",
            "x",
            higher_is_better=False,
        ),
    )
}
