from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from agent.contract.wire import DeviceCapabilities, DeviceClass, Owner, Transport


class DeviceRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    node_id: uuid.UUID
    name: str
    model: str
    serial: str
    wwid: str
    transport: Transport
    device_class: DeviceClass
    class_evidence: list[str]
    rotational: bool
    size_bytes: int
    holds_data: bool
    holds_data_reasons: list[str]
    capabilities: DeviceCapabilities
    owners: list[Owner] = []  # what else sets its queue attributes: udev rules, TuneD
    present: bool
    first_seen_at: datetime
    last_seen_at: datetime


class InventoryReceipt(BaseModel):
    devices: list[DeviceRead]
    added: int
    updated: int
    gone: int
