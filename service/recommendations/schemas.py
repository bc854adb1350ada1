from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from agent.contract.base import InputModel
from agent.contract.metrics import METRICS
from agent.contract.tunables import DeviceConfig
from agent.contract.wire import CanaryDone
from agent.contract.workloads import WorkloadSpec
from models.priors import Objective

__all__ = ["CanaryDone"]

# proposed → verifying (accepted: its one-device rollout tries it under a canary) → kept |
# rolled_back; applied (pinned without a canary); reverted (undone by an operator); rejected,
# superseded, refuted (its canary failed before anyone decided). 'accepted': decided before
# accepting went through a canary.
Status = Literal[
    "proposed",
    "accepted",
    "verifying",
    "kept",
    "rolled_back",
    "applied",
    "reverted",
    "rejected",
    "superseded",
    "refuted",
]


class Prediction(BaseModel):
    """One objective's predicted value now and under the recommendation (in `unit`), and the
    change with an 80 % interval. `change` is the relative change of the metric (latency 20 %
    lower: -0.2); `gain` is the improvement, higher is better (+0.2) — what every view shows."""

    metric: str
    current: float
    recommended: float
    change: float
    change_low: float
    change_high: float
    higher_is_better: bool

    @computed_field  # type: ignore[prop-decorator]
    @property
    def unit(self) -> str:
        """The unit of `current` and `recommended` (both predicted by the model)."""
        known = METRICS.get(self.metric)
        return known.unit if known else ""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gain(self) -> float:
        """The improvement: the change where higher is better, its negative where lower is
        (latency 20 % lower: gain +0.2)."""
        return self.change if self.higher_is_better else -self.change

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gain_low(self) -> float:
        return self.change_low if self.higher_is_better else -self.change_high

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gain_high(self) -> float:
        return self.change_high if self.higher_is_better else -self.change_low


class CanaryEffect(BaseModel):
    """One metric as the canary measured it: the gain (improvement, higher is better,
    relative: +0.2 is 20 % better) with its interval (at `confidence`), and the two arms'
    medians in `unit`."""

    label: str
    unit: str
    higher_is_better: bool
    gain: float
    gain_low: float
    gain_high: float
    baseline: float
    candidate: float | None
    confidence: float | None = None


class RecommendationCanary(BaseModel):
    """The latest canary of the recommended configuration on the device since the
    recommendation was made."""

    observation_id: uuid.UUID
    verdict: Literal["pass", "fail", "inconclusive"]
    finished_at: datetime
    workload: str
    effects: dict[str, CanaryEffect]


class RecommendationRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    device_id: uuid.UUID
    model_version_id: uuid.UUID
    objective: str  # the lead one
    objectives: list[str]  # every objective this configuration is recommended for
    workload_name: str
    workload_basis: str
    current_config: DeviceConfig | None
    recommended_config: DeviceConfig
    changes_configuration: bool
    predictions: dict[str, Prediction]
    confidence: float = Field(
        description="the share of the model's ensemble members that also rank this"
        " configuration first for the lead objective: how settled the ranking is, not a"
        " probability that the change helps (that is what the predictions' intervals say)"
    )
    evidence: dict[str, Any]
    reason: str
    next_canary: DeviceConfig | None
    expected_gain: float
    status: Status
    decided_by: str | None
    decided_at: datetime | None
    decision_reason: str | None
    canary: RecommendationCanary | None = None
    rollout_id: uuid.UUID | None = Field(
        default=None, description="the one-device rollout that tries it under a canary"
    )
    created_at: datetime
    superseded: list[uuid.UUID] = Field(
        default_factory=list,
        description="on accepting: the device's other open recommendations this superseded",
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def standing(self) -> str:
        """What the evidence says of it: refuted (its canary failed), proven (passed),
        unproven (inconclusive), or predicted (no canary of it yet)."""
        if self.canary is None:
            return "predicted"
        return {"fail": "refuted", "pass": "proven"}.get(self.canary.verdict, "unproven")


class Decision(InputModel):
    reason: Annotated[str, Field(min_length=3, max_length=2_000, description="why, for the audit")]


class Acceptance(Decision):
    """Accepting tries the configuration on the device under a canary (a one-device rollout)
    and keeps it only if the canary passes and the soak holds."""

    without_canary: bool = Field(
        default=False,
        description="pin the configuration at once, with no canary: an explicit, audited choice",
    )
    on_inconclusive: Literal["roll_back", "pause"] = Field(
        default="roll_back",
        description="an inconclusive canary puts the device back (default) or waits for an"
        " operator on the rollout",
    )
    soak_seconds: Annotated[float, Field(ge=0, le=7 * 86_400)] = Field(
        default=300.0,
        description="after the canary passed: how long the guardrails watch before it is kept",
    )


class ModelVersionRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    run_id: uuid.UUID
    device_class: str
    objective: str
    rows: int
    cells: int
    data_from: datetime | None
    data_until: datetime | None
    scores: dict[str, Any]
    parameters: dict[str, Any]
    created_at: datetime


class ScheduledCanaryRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    run_id: uuid.UUID
    device_id: uuid.UUID
    objective: str
    workload_name: str
    workload: WorkloadSpec
    config: DeviceConfig
    expected_gain: float = Field(
        description="the search's optimistic bound (UCB) on this configuration's gain over the"
        " recommended one, as a fraction: what ranks canaries for learning, not a prediction"
    )
    uncertainty: float
    rank: int
    status: str
    created_at: datetime
    recommendation_id: uuid.UUID | None = Field(
        default=None, description="the device's open recommendation of this configuration"
    )
    prediction: Prediction | None = Field(
        default=None,
        description="that recommendation's prediction for its lead objective: the same figures"
        " the dashboard, the CLI and the API show for it",
    )


NightlyStatus = Literal["queued", "running", "done", "failed"]


class NightlyRequest(InputModel):
    """A nightly run as `blkpilot nightly` takes it: what to train and how many canaries to
    schedule. It runs in the service, on its Ray (RAY_ADDRESS) or, with `local`, in the
    service's own process."""

    objectives: list[Objective] | None = Field(
        default=None, max_length=16, description="all with data if unset"
    )
    window_hours: Annotated[float, Field(ge=0.1, le=24 * 90)] = 24.0
    max_canaries: Annotated[int, Field(ge=0, le=10_000)] = 10
    mix: dict[Objective, Annotated[float, Field(gt=0.0, le=1e6)]] | None = None
    local: bool = False


class NightlyRunRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    status: NightlyStatus
    options: dict[str, Any]
    requested_by: str
    report: dict[str, Any] | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
