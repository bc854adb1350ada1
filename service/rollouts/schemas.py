from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent.contract.base import InputModel, SafeText
from agent.contract.sli import AppSli
from agent.contract.tunables import DeviceConfig, WantedConfig
from agent.contract.wire import DeviceClass

RolloutStatus = Literal["running", "paused", "rolling_back", "succeeded", "rolled_back", "failed"]
TargetStatus = Literal[
    "pending",
    "changing",
    "passed",
    "failed",
    "inconclusive",
    "rolling_back",
    "rolled_back",
    "restore_failed",
]
StageSpec = Annotated[str, Field(pattern=r"^(100|[1-9][0-9]?)%$|^[1-9][0-9]{0,5}$")]
Serial = Annotated[str, Field(pattern=r"^(100|[1-9][0-9]?)%$|^[1-9][0-9]{0,5}$")]


class TargetSelector(InputModel):
    """Which devices: every condition given must hold (a class, node labels, explicit ids)."""

    device_class: DeviceClass | None = None
    node_labels: dict[SafeText, SafeText] = Field(default_factory=dict, max_length=32)
    device_ids: list[uuid.UUID] = Field(default_factory=list, max_length=10_000)

    @model_validator(mode="after")
    def _something(self) -> Self:
        if self.device_class is None and not self.node_labels and not self.device_ids:
            raise ValueError("name devices: a device_class, node_labels or device_ids")
        return self


class CanarySettings(InputModel):
    """The agent's canary on each device: the candidate against what the device runs now."""

    workload: Annotated[str, Field(min_length=1, max_length=128)] = "hs23-single-randread-4k-qd1"
    rounds: Annotated[int, Field(ge=3, le=100)] = 8  # before the first look
    # the budget: more rounds while inconclusive, up to this many (default 3 x rounds)
    max_rounds: Annotated[int | None, Field(ge=3, le=300)] = None
    round_seconds: Annotated[float, Field(ge=0.1, le=600)] = 1.0
    alpha: Annotated[float, Field(ge=0.001, le=0.5)] = 0.05
    # a live canary judges this too, beside block latency: the application's own SLI, read on
    # each node (a loopback URL names every node's own exporter: target a node label)
    sli: AppSli | None = None
    # whether a lower data rate under the candidate is harm: "closed" (the device sets the
    # application's pace), "open" (its clients do), "auto" (the canary tells from the traffic)
    loop: Literal["auto", "closed", "open"] = "auto"
    # an inconclusive canary: the rollout waits for an operator ("pause") or puts the device
    # back at once ("roll_back": what an accepted recommendation's rollout does by default)
    on_inconclusive: Literal["pause", "roll_back"] = "pause"

    @model_validator(mode="after")
    def _budget_covers_the_first_look(self) -> Self:
        if self.max_rounds is not None and self.max_rounds < self.rounds:
            raise ValueError(f"max_rounds {self.max_rounds} is fewer than rounds {self.rounds}")
        return self


class Guardrails(InputModel):
    """Checked during each stage's soak on the devices changed so far: the agent reports the
    policy applied and holding, and mean latency in telemetry does not grow beyond the ratio
    (compared only with at least min_windows telemetry windows before and during the soak)."""

    max_latency_ratio: Annotated[float, Field(gt=1.0, le=100.0)] = 1.5
    min_windows: Annotated[int, Field(ge=1, le=1_000)] = 2


class RolloutCreate(InputModel):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    config: WantedConfig
    target: TargetSelector
    stages: list[StageSpec] = Field(
        default_factory=lambda: ["1", "10%", "50%", "100%"],
        min_length=1,
        max_length=10,
        description="cumulative: a node count or a percentage of the target's nodes; the last"
        " must reach every node",
    )
    serial: Serial = Field(default="100%", description="ansible batch size within a stage")
    max_fail_percentage: Annotated[int, Field(ge=0, le=100)] = 0
    soak_seconds: Annotated[float, Field(ge=0, le=7 * 86_400)] = 300.0
    canary: CanarySettings = Field(default_factory=CanarySettings)
    guardrails: Guardrails = Field(default_factory=Guardrails)
    reason: Annotated[str, Field(min_length=3, max_length=2_000)]


class RolloutAction(InputModel):
    reason: Annotated[str, Field(min_length=3, max_length=2_000, description="why, for the audit")]


class RolloutTargetRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    device_id: uuid.UUID
    node_id: uuid.UUID
    hostname: str
    device_name: str
    stage: int
    status: TargetStatus
    verdict: str | None
    detail: str
    attempts: int
    updated_at: datetime


class StageRead(BaseModel):
    index: int
    spec: str
    hosts: list[str]
    status: Literal["pending", "canary", "soak", "passed", "failed", "paused", "rolled_back"]


class RolloutRead(BaseModel):
    id: uuid.UUID
    name: str
    status: RolloutStatus
    status_detail: str
    config: DeviceConfig
    target: dict[str, object]
    workload_name: str
    canary: CanarySettings
    guardrails: Guardrails
    serial: str
    max_fail_percentage: int
    soak_seconds: float
    stage: int
    phase: Literal["canary", "soak"]
    soak_until: datetime | None
    stages: list[StageRead]
    counts: dict[str, int]
    targets: list[RolloutTargetRead]
    reason: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
