from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.security import Role
from service.tables import Device
from tests.factories import (
    bearer,
    create_api_token,
    create_node,
    device_inventory,
    report_inventory,
)

URL = "/api/v1/observations"


def _observation(device: Device, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "device_id": str(device.id),
        "kind": "benchmark",
        "tool": "fio",
        "workload": {"name": "randread-4k-qd1", "jobs": [{"name": "reader"}]},
        "configuration": {"scheduler": "none"},
        "metrics": {"iops": 81234.0, "clat_p50_us": 12.5, "clat_p99_us": 30.1},
        "started_at": "2026-11-01T12:00:00+00:00",
        "finished_at": "2026-11-01T12:00:30+00:00",
    }
    body.update(overrides)
    return body


class TestRecordObservation:
    def test_node_records_for_its_own_device(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        response = client.post(URL, json=_observation(device), headers=bearer(token))
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["metrics"]["clat_p50_us"] == 12.5
        assert body["recorded_by"].startswith("node:")

    def test_canary_keeps_verdict_and_statistics(
        self, client: TestClient, session: Session
    ) -> None:
        node, token = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        body = _observation(
            device,
            kind="canary",
            verdict="fail",
            statistics={"mann_whitney_p": 0.001, "hodges_lehmann_shift_us": 4.2},
        )
        response = client.post(URL, json=body, headers=bearer(token))
        assert response.status_code == 201
        assert response.json()["verdict"] == "fail"
        assert response.json()["statistics"]["mann_whitney_p"] == 0.001

    def test_canary_without_verdict_is_422(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        response = client.post(URL, json=_observation(device, kind="canary"), headers=bearer(token))
        assert response.status_code == 422
        assert "verdict" in response.json()["detail"]

    def test_for_another_nodes_device_is_403(self, client: TestClient, session: Session) -> None:
        _, token = create_node(session, hostname="a")
        other, _ = create_node(session, hostname="b")
        (device,) = report_inventory(session, other, device_inventory("loop0"))
        response = client.post(URL, json=_observation(device), headers=bearer(token))
        assert response.status_code == 403

    def test_operator_may_record_viewer_may_not(self, client: TestClient, session: Session) -> None:
        node, _ = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        operator = create_api_token(session, role=Role.OPERATOR)
        viewer = create_api_token(session, role=Role.VIEWER)
        assert (
            client.post(URL, json=_observation(device), headers=bearer(operator)).status_code == 201
        )
        assert (
            client.post(URL, json=_observation(device), headers=bearer(viewer)).status_code == 403
        )

    def test_unknown_device_is_422(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        body = _observation(device, device_id="00000000-0000-0000-0000-000000000000")
        response = client.post(URL, json=body, headers=bearer(token))
        assert response.status_code == 422
        assert response.json()["fields"][0]["loc"] == ["body", "device_id"]

    def test_scheduler_the_device_lacks_is_422(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        body = _observation(device, configuration={"scheduler": "fios"})
        response = client.post(URL, json=body, headers=bearer(token))
        assert response.status_code == 422
        assert "fios" in response.json()["detail"]

    def test_bad_metrics_are_422(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        for metrics in ({}, {"Bad Name": 1.0}, {"iops": "fast"}):
            response = client.post(
                URL, json=_observation(device, metrics=metrics), headers=bearer(token)
            )
            assert response.status_code == 422, metrics

    def test_finished_before_started_is_422(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        body = _observation(device, finished_at="2026-11-01T11:00:00+00:00")
        assert client.post(URL, json=body, headers=bearer(token)).status_code == 422

    @pytest.mark.parametrize(
        ("started", "finished", "field"),
        [
            ("9999-12-31T12:00:00+00:00", "9999-12-31T12:00:30+00:00", "finished_at"),
            ("1970-01-01T00:00:00+00:00", "1970-01-01T00:00:30+00:00", None),
        ],
        ids=["year-9999", "year-1970"],
    )
    def test_dates_where_no_measurement_can_be_are_422(
        self,
        client: TestClient,
        session: Session,
        started: str,
        finished: str,
        field: str | None,
    ) -> None:
        """Bounded as telemetry windows are: not before 2000, not past the server's clock."""
        node, token = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        body = _observation(device, started_at=started, finished_at=finished)
        response = client.post(URL, json=body, headers=bearer(token))
        assert response.status_code == 422, response.text
        if field is not None:
            assert response.json()["fields"][0]["loc"] == ["body", field]
        viewer = create_api_token(session, role=Role.VIEWER)
        assert client.get(URL, headers=bearer(viewer)).json() == []


class TestListObservations:
    def test_filters_by_device_and_kind(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        loop0, loop1 = report_inventory(
            session, node, device_inventory("loop0"), device_inventory("loop1")
        )
        client.post(URL, json=_observation(loop0), headers=bearer(token))
        client.post(URL, json=_observation(loop1), headers=bearer(token))
        client.post(
            URL, json=_observation(loop1, kind="canary", verdict="pass"), headers=bearer(token)
        )
        viewer = create_api_token(session, role=Role.VIEWER)
        listed = client.get(
            URL, params={"device_id": str(loop1.id), "kind": "canary"}, headers=bearer(viewer)
        ).json()
        assert [(o["device_id"], o["kind"]) for o in listed] == [(str(loop1.id), "canary")]


class TestGetObservation:
    def test_unknown_is_404(self, client: TestClient, session: Session) -> None:
        viewer = create_api_token(session, role=Role.VIEWER)
        response = client.get(f"{URL}/00000000-0000-0000-0000-000000000000", headers=bearer(viewer))
        assert response.status_code == 404
