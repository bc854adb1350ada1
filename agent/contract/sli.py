"""An application's own service-level indicator, as a live canary judges it beside block
latency: read from the application's Prometheus endpoint at the start and end of every canary
interval, the interval's value is

- `ratio`: the increase of one counter over the increase of another — total time over calls
  (pg_stat_statements' total_exec_time and calls, PostgreSQL's WAL sync time and syncs, a
  summary's `_sum` and `_count`): a mean per event;
- `histogram`: a quantile of the interval's increase of a Prometheus histogram's buckets.

Series are selected by `labels` (every label given must match); the matching series are summed.
The canary judges it like any other metric: non-inferiority at `tolerance` (relative), in the
direction `higher_is_better` says. By default a pass needs the SLI and block latency both
within their tolerances. With `decides`, the SLI alone is needed for a pass and block latency
can still fail a candidate (a shift past its tolerance, confidently) but no longer hold a pass
back: for an SLI that covers all the application does (every query's time), on a workload whose
block-level tail is far noisier than what it feels — MariaDB's doublewrite bursts made an
unchanged configuration's block p99 straddle a 10 % tolerance after 8 minutes. One definition,
read by the agent's command line, rollouts and the nightly job's canaries.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import AnyHttpUrl, Field, model_validator

from agent.contract.base import WireModel

_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
MetricName = Annotated[str, Field(pattern=_METRIC.pattern, max_length=200)]
SLI_METRIC = "app_sli"  # the name the canary's samples and statistics carry


class AppSli(WireModel):
    url: AnyHttpUrl = Field(description="the application's Prometheus endpoint (/metrics)")
    kind: Literal["ratio", "histogram"]
    metric: MetricName = Field(description="ratio: the numerator counter; histogram: its name")
    per: MetricName | None = Field(
        default=None, description="ratio: the denominator counter (calls, syncs, _count)"
    )
    quantile: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.99  # histogram
    labels: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=255)]] = (
        Field(default_factory=dict, max_length=16)
    )
    higher_is_better: bool = False  # a latency by default
    tolerance: Annotated[float, Field(gt=0.0, le=1.0)] = 0.10
    # the application's own resolution: its counters move this often at best (PostgreSQL
    # flushes a backend's statistics at most once a second), so canary intervals are at least
    # this long where the SLI is judged
    min_interval_s: Annotated[float, Field(ge=0.0, le=600.0)] = 2.0
    # the SLI alone is needed for a pass; block latency can fail a candidate but not hold a
    # pass back (the module's docstring says where that fits)
    decides: bool = False
    description: Annotated[str, Field(max_length=200)] = ""  # what it is, for people

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.kind == "ratio" and self.per is None:
            raise ValueError("a ratio SLI names its denominator: per")
        if self.kind == "histogram" and self.per is not None:
            raise ValueError("a histogram SLI has no denominator (per)")
        return self
