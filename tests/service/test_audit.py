from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.audit import service as audit
from service.security import Role
from tests.factories import bearer, create_api_token, create_node


class TestListAuditEvents:
    def test_pages_backwards_newest_first(self, client: TestClient, session: Session) -> None:
        for i in range(5):
            audit.record(session, "tests", "test.event", target_type="thing", target_id=f"t{i}")
        viewer = create_api_token(session, role=Role.VIEWER)
        first = client.get(
            "/api/v1/audit", params={"action": "test.event", "limit": 2}, headers=bearer(viewer)
        ).json()
        assert [e["target_id"] for e in first] == ["t4", "t3"]
        rest = client.get(
            "/api/v1/audit",
            params={"action": "test.event", "before_id": first[-1]["id"]},
            headers=bearer(viewer),
        ).json()
        assert [e["target_id"] for e in rest] == ["t2", "t1", "t0"]

    def test_node_token_is_403(self, client: TestClient, session: Session) -> None:
        _, token = create_node(session)
        assert client.get("/api/v1/audit", headers=bearer(token)).status_code == 403

    def test_limit_is_bounded(self, client: TestClient, session: Session) -> None:
        viewer = create_api_token(session, role=Role.VIEWER)
        response = client.get("/api/v1/audit", params={"limit": 100_000}, headers=bearer(viewer))
        assert response.status_code == 422
