from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field

from agent.contract.base import InputModel
from agent.contract.tunables import DeviceConfig, WantedConfig
from agent.contract.wire import AppliedStatus, OwnerPolicy


class PolicySet(InputModel):
    config: WantedConfig
    owners: OwnerPolicy = Field(
        default=OwnerPolicy.TAKE_OVER,
        description="where a udev rule or TuneD profile sets the same attribute: take_over"
        " (apply, and again once per change it makes) or yield (its setting stands)",
    )
    reason: Annotated[str, Field(min_length=3, max_length=2_000, description="why, for the audit")]


class PolicyRevert(InputModel):
    reason: Annotated[str, Field(min_length=3, max_length=2_000, description="why, for the audit")]


class AppliedState(BaseModel):
    version: int
    status: AppliedStatus
    config: DeviceConfig | None
    detail: str
    at: datetime


class PolicyRead(BaseModel):
    device_id: uuid.UUID
    device_name: str
    node_id: uuid.UUID
    config: DeviceConfig
    owners: OwnerPolicy = OwnerPolicy.TAKE_OVER
    version: int
    set_by: str
    reason: str
    created_at: datetime
    updated_at: datetime
    applied: AppliedState | None
    in_sync: bool = Field(description="the agent reported applying exactly this version")
