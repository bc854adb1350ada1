from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from agent.contract.base import InputModel


class NodeRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    hostname: str
    labels: dict[str, str]
    agent_version: str
    kernel_version: str
    enrolled_at: datetime
    last_seen_at: datetime | None
    token_expires_at: datetime
    revoked_at: datetime | None


class NodeTokenIssued(BaseModel):
    """A node token, with when it expires and when its agent should renew it."""

    node_token: str
    expires_at: datetime
    renew_after: datetime


class NodeEnrolled(NodeTokenIssued):
    node: NodeRead


class NodeRevoke(InputModel):
    reason: Annotated[str, Field(min_length=3, max_length=2_000, description="why, for the audit")]
