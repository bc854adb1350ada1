"""Reading an application's SLI (agent.contract.sli) from its Prometheus endpoint: a scrape is
a snapshot of the cumulative series the SLI needs; two snapshots give an interval's value."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agent.contract.sli import AppSli
from agent.errors import AgentError


class SliUnavailable(AgentError):
    """The application's endpoint cannot be read, or lacks the SLI's series."""


@dataclass(frozen=True)
class SliSnapshot:
    numerator: float = 0.0
    denominator: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count


class SliReader:
    def __init__(self, spec: AppSli, timeout_s: float = 2.0) -> None:
        self.spec = spec
        self.client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def read(self) -> SliSnapshot:
        try:
            response = self.client.get(str(self.spec.url))
            response.raise_for_status()
        except httpx.HTTPError as error:
            raise SliUnavailable(f"cannot read the SLI from {self.spec.url}: {error}") from error
        return self.parse(response.text)

    def parse(self, text: str) -> SliSnapshot:
        spec = self.spec
        numerator = denominator = 0.0
        buckets: dict[float, float] = {}
        seen = set()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if any(sample.labels.get(k) != v for k, v in spec.labels.items()):
                    continue
                name = sample.name
                if spec.kind == "ratio":
                    if name in (spec.metric, f"{spec.metric}_total"):
                        numerator += sample.value
                        seen.add("numerator")
                    elif spec.per is not None and name in (spec.per, f"{spec.per}_total"):
                        denominator += sample.value
                        seen.add("denominator")
                elif name == f"{spec.metric}_bucket" and "le" in sample.labels:
                    bound = float(sample.labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + sample.value
                    seen.add("buckets")
        wanted = {"numerator", "denominator"} if spec.kind == "ratio" else {"buckets"}
        if not wanted <= seen:
            chosen = ", ".join(f"{k}={v}" for k, v in spec.labels.items()) or "any labels"
            raise SliUnavailable(
                f"{spec.url} has no series {spec.metric}"
                f"{' and ' + spec.per if spec.per else ''} with {chosen}"
            )
        return SliSnapshot(numerator, denominator, buckets)

    def between(self, before: SliSnapshot, after: SliSnapshot) -> float | None:
        """The interval's value; None when nothing happened in it (no calls, no observations)
        or a counter went backwards (the application restarted)."""
        if self.spec.kind == "ratio":
            events = after.denominator - before.denominator
            total = after.numerator - before.numerator
            if events <= 0 or total < 0:
                return None
            return total / events
        return _quantile(
            {le: after.buckets.get(le, 0.0) - n for le, n in before.buckets.items()},
            self.spec.quantile,
        )


def _quantile(cumulative: dict[float, float], q: float) -> float | None:
    """Prometheus' histogram_quantile over one interval's bucket increases: linear within the
    bucket that holds the rank; the top finite bound where the rank is in +Inf."""
    bounds = sorted(cumulative)
    if not bounds or any(cumulative[b] < 0 for b in bounds):
        return None
    total = cumulative[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower
