"""The other owners an agent reports with a device (issue 70, item 1: udev rules, a TuneD
profile) are kept with the device, returned by the API, and said alike by `blkpilot devices
show` and the device's page: "owned by: udev rule 60-ioschedulers.rules:3 (scheduler=bfq)"."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from agent.contract.wire import Owner, OwnerKind
from service.cli import app
from service.security import Role
from tests.factories import bearer, create_api_token, create_node, device_inventory
from tests.service.test_dashboard_pages import _sign_in

UDEV = Owner(kind=OwnerKind.UDEV, source="60-ioschedulers.rules:3", settings={"scheduler": "bfq"})
TUNED = Owner(
    kind=OwnerKind.TUNED,
    source="throughput-performance (throughput-performance/tuned.conf [disk])",
    settings={"read_ahead_kb": ">4096"},
    certain=False,
)


def test_owners_are_kept_returned_and_shown(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, token = create_node(session)
    inventory: dict[str, Any] = {
        "kernel_version": "6.1.0-18-amd64",
        "devices": [device_inventory("sdq", owners=[UDEV, TUNED]).model_dump(mode="json")],
    }
    put = client.put(f"/api/v1/nodes/{node.id}/inventory", json=inventory, headers=bearer(token))
    assert put.status_code == 200, put.text
    (device,) = put.json()["devices"]
    assert [o["source"] for o in device["owners"]] == [UDEV.source, TUNED.source]

    viewer = create_api_token(session, role=Role.VIEWER)
    session.commit()
    monkeypatch.setattr(httpx, "request", client.request)
    shown = CliRunner().invoke(
        app, ["devices", "show", device["id"][:8], "--url", "http://testserver", "--token", viewer]
    )
    assert shown.exit_code == 0, shown.output
    assert "owned by    udev rule 60-ioschedulers.rules:3 (scheduler=bfq)" in shown.output
    assert "TuneD profile throughput-performance" in shown.output
    assert "(read_ahead_kb=>4096), may apply" in shown.output

    _sign_in(client, viewer)
    page = client.get(f"/ui/devices/{device['id']}")
    assert page.status_code == 200
    said = page.text.split('data-testid="owner">')
    assert said[1].startswith("udev rule 60-ioschedulers.rules:3 (scheduler=bfq)")
    assert "may apply" in said[2]

    # a node that reports no owners any more: none kept
    inventory["devices"][0]["owners"] = []
    again = client.put(f"/api/v1/nodes/{node.id}/inventory", json=inventory, headers=bearer(token))
    assert again.json()["devices"][0]["owners"] == []
