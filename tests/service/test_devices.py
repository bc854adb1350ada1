from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from agent.contract.tunables import Scheduler
from service.security import Role
from tests.factories import (
    bearer,
    create_api_token,
    create_node,
    device_inventory,
    report_inventory,
)


def _inventory(*devices: Any) -> dict[str, Any]:
    return {
        "kernel_version": "6.1.0-18-amd64",
        "devices": [d.model_dump(mode="json") if hasattr(d, "model_dump") else d for d in devices],
    }


class TestPutInventory:
    def test_node_reports_its_devices(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        response = client.put(
            f"/api/v1/nodes/{node.id}/inventory",
            json=_inventory(device_inventory("loop0"), device_inventory("loop1", holds_data=True)),
            headers=bearer(token),
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["added"], body["updated"], body["gone"]) == (2, 0, 0)
        by_name = {device["name"]: device for device in body["devices"]}
        assert by_name["loop1"]["holds_data"] is True
        assert by_name["loop0"]["capabilities"]["available_schedulers"] == [
            "none",
            "mq-deadline",
            "kyber",
            "bfq",
        ]

    def test_configuration_change_is_audited_and_missing_devices_marked_gone(
        self, client: TestClient, session: Session
    ) -> None:
        node, token = create_node(session)
        url = f"/api/v1/nodes/{node.id}/inventory"
        client.put(
            url,
            json=_inventory(device_inventory("loop0"), device_inventory("loop1")),
            headers=bearer(token),
        )
        second = client.put(
            url,
            json=_inventory(device_inventory("loop0", scheduler=Scheduler.BFQ)),
            headers=bearer(token),
        ).json()
        assert (second["added"], second["updated"], second["gone"]) == (0, 1, 1)
        present = {d["name"]: d["present"] for d in second["devices"]}
        assert present == {"loop0": True, "loop1": False}
        loop0 = next(d for d in second["devices"] if d["name"] == "loop0")
        viewer = create_api_token(session, role=Role.VIEWER)
        events = client.get(
            "/api/v1/audit",
            params={"target_id": loop0["id"], "action": "device.config_changed"},
            headers=bearer(viewer),
        ).json()
        assert len(events) == 1
        assert events[0]["before"]["scheduler"] == "none"
        assert events[0]["after"]["scheduler"] == "bfq"

    def test_for_another_node_is_403(self, client: TestClient, session: Session) -> None:
        _, token = create_node(session, hostname="a")
        other, _ = create_node(session, hostname="b")
        response = client.put(
            f"/api/v1/nodes/{other.id}/inventory",
            json=_inventory(device_inventory()),
            headers=bearer(token),
        )
        assert response.status_code == 403

    def test_operator_cannot_report_inventory(self, client: TestClient, session: Session) -> None:
        node, _ = create_node(session)
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.put(
            f"/api/v1/nodes/{node.id}/inventory",
            json=_inventory(device_inventory()),
            headers=bearer(admin),
        )
        assert response.status_code == 403

    def test_inconsistent_device_is_422_and_nothing_stored(
        self, client: TestClient, session: Session
    ) -> None:
        node, token = create_node(session)
        bad = device_inventory("loop1").model_dump(mode="json")
        bad["capabilities"]["available_schedulers"] = ["none"]
        bad["capabilities"]["current_scheduler"] = "bfq"
        response = client.put(
            f"/api/v1/nodes/{node.id}/inventory",
            json=_inventory(device_inventory("loop0"), bad),
            headers=bearer(token),
        )
        assert response.status_code == 422
        assert response.json()["fields"][0]["loc"][:3] == ["body", "devices", 1]
        viewer = create_api_token(session, role=Role.VIEWER)
        listed = client.get(
            "/api/v1/devices", params={"node_id": str(node.id)}, headers=bearer(viewer)
        )
        assert listed.json() == []

    def test_duplicate_device_names_are_422(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        response = client.put(
            f"/api/v1/nodes/{node.id}/inventory",
            json=_inventory(device_inventory("loop0"), device_inventory("loop0")),
            headers=bearer(token),
        )
        assert response.status_code == 422
        assert "loop0" in response.json()["detail"]

    def test_bad_device_name_is_422(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        bad = device_inventory("loop0").model_dump(mode="json")
        bad["name"] = "../../etc"
        response = client.put(
            f"/api/v1/nodes/{node.id}/inventory", json=_inventory(bad), headers=bearer(token)
        )
        assert response.status_code == 422


class TestListDevices:
    def test_filters_by_class(self, client: TestClient, session: Session) -> None:
        from agent.contract.wire import DeviceClass
        from tests.factories import report_inventory

        node, _ = create_node(session)
        report_inventory(
            session,
            node,
            device_inventory("loop0", device_class=DeviceClass.ULL),
            device_inventory("sda", device_class=DeviceClass.HDD, rotational=True),
        )
        viewer = create_api_token(session, role=Role.VIEWER)
        hdds = client.get("/api/v1/devices", params={"device_class": "hdd"}, headers=bearer(viewer))
        assert [d["name"] for d in hdds.json()] == ["sda"]
        bad = client.get(
            "/api/v1/devices", params={"device_class": "floppy"}, headers=bearer(viewer)
        )
        assert bad.status_code == 422


class TestGetDevice:
    def test_unknown_is_404(self, client: TestClient, session: Session) -> None:
        viewer = create_api_token(session, role=Role.VIEWER)
        response = client.get(
            "/api/v1/devices/00000000-0000-0000-0000-000000000000", headers=bearer(viewer)
        )
        assert response.status_code == 404

    def test_node_reads_only_its_own(self, client: TestClient, session: Session) -> None:
        from tests.factories import report_inventory

        node, token = create_node(session, hostname="a")
        other, _ = create_node(session, hostname="b")
        (mine,) = report_inventory(session, node, device_inventory("loop0"))
        (theirs,) = report_inventory(session, other, device_inventory("loop0"))
        assert client.get(f"/api/v1/devices/{mine.id}", headers=bearer(token)).status_code == 200
        assert client.get(f"/api/v1/devices/{theirs.id}", headers=bearer(token)).status_code == 403


class TestNodeDevices:
    def test_node_lists_its_own_devices_only(self, client: TestClient, session: Session) -> None:
        from tests.factories import report_inventory

        node, token = create_node(session, hostname="a")
        other, _ = create_node(session, hostname="b")
        report_inventory(session, node, device_inventory("loop0"), device_inventory("loop1"))
        mine = client.get(f"/api/v1/nodes/{node.id}/devices", headers=bearer(token))
        assert mine.status_code == 200, mine.text
        assert [d["name"] for d in mine.json()] == ["loop0", "loop1"]
        theirs = client.get(f"/api/v1/nodes/{other.id}/devices", headers=bearer(token))
        assert theirs.status_code == 403


def test_the_device_list_pages_with_a_cursor(client: TestClient, session: Session) -> None:
    node, _ = create_node(session, hostname="cursor-node")
    names = [f"loop{i}" for i in range(5)]
    report_inventory(session, node, *(device_inventory(n) for n in names))
    viewer = bearer(create_api_token(session, role=Role.VIEWER))
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"node_id": str(node.id), "limit": 2}
        if cursor:
            params["cursor"] = cursor
        response = client.get("/api/v1/devices", params=params, headers=viewer)
        assert response.status_code == 200, response.text
        seen += [d["name"] for d in response.json()]
        pages += 1
        cursor = response.headers.get("X-Next-Cursor")
        if cursor is None:
            break
    assert seen == names
    assert pages == 3
    refused = client.get("/api/v1/devices", params={"cursor": "nope"}, headers=viewer)
    assert refused.status_code == 422
    assert refused.json()["fields"][0]["loc"] == ["query", "cursor"]
