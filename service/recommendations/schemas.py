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

__all__ = ["CanaryDone"]

Status = Literal["proposed", "accepted", "rejected", "superseded", "refuted"]


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
