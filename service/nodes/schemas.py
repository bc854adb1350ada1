from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict


class NodeRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    hostname: str
    labels: dict[str, str]
    agent_version: str
    kernel_version: str
    enrolled_at: datetime
    last_seen_at: datetime | None


class NodeEnrolled(BaseModel):
    node: NodeRead
    node_token: str
