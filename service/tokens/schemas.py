from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from agent.contract.base import InputModel
from agent.contract.labels import Labels
from service.security import Role

TokenName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@-]+$")]


class ApiTokenCreate(InputModel):
    name: TokenName
    role: Role
    ttl_hours: Annotated[float | None, Field(gt=0, le=24 * 3650)] = Field(
        default=24 * 90,
        description="hours until it expires (default 90 days); null: it never expires",
    )


class ApiTokenRotate(InputModel):
    ttl_hours: Annotated[float | None, Field(gt=0, le=24 * 3650)] = Field(
        default=24 * 90,
        description="hours until the new secret expires (default 90 days); null: never",
    )


class ApiTokenRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    name: str
    role: Role
    created_by: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = None  # None: never
    last_used_at: datetime | None = None  # to the minute


class ApiTokenCreated(ApiTokenRead):
    token: str = Field(description="shown once; only its hash is stored")


class EnrollmentTokenCreate(InputModel):
    labels: Labels = Field(default_factory=dict, description="labels given to the node")
    ttl_hours: Annotated[float | None, Field(gt=0, le=24 * 30)] = None


class EnrollmentTokenCreated(BaseModel):
    id: uuid.UUID
    token: str = Field(description="one-time; shown once")
    labels: dict[str, str]
    expires_at: datetime
