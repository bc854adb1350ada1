from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.security import Role, token_digest
from service.tables import EnrollmentToken, Node
from tests.factories import bearer, create_api_token, create_enrollment_token, create_node


class TestEnroll:
    def test_returns_a_node_token_that_works(self, client: TestClient, session: Session) -> None:
        token = create_enrollment_token(session, labels={"rack": "r1"})
        response = client.post(
            "/api/v1/nodes",
            json={
                "enrollment_token": token,
                "hostname": "db-07",
                "labels": {"rack": "r9", "az": "a"},
            },
        )
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["node"]["hostname"] == "db-07"
        # the admin's labels on the enrollment token win over what the node claims
        assert body["node"]["labels"] == {"rack": "r1", "az": "a"}
        node_id = body["node"]["id"]
        beat = client.post(
            f"/api/v1/nodes/{node_id}/heartbeat", json={}, headers=bearer(body["node_token"])
        )
        assert beat.status_code == 200

    def test_token_works_only_once(self, client: TestClient, session: Session) -> None:
        token = create_enrollment_token(session)
        first = client.post("/api/v1/nodes", json={"enrollment_token": token, "hostname": "a"})
        second = client.post("/api/v1/nodes", json={"enrollment_token": token, "hostname": "b"})
        assert first.status_code == 201
        assert second.status_code == 401
        assert second.json()["error"] == "unauthorized"
        # the token names the node that used it (claimed and the node added in one statement);
        # the refused enrolment added no node
        session.expire_all()
        used = session.scalars(
            select(EnrollmentToken).where(EnrollmentToken.token_sha256 == token_digest(token))
        ).one()
        assert str(used.used_by_node_id) == first.json()["node"]["id"]
        assert used.used_at is not None
        assert session.scalars(select(Node).where(Node.hostname == "b")).all() == []

    def test_expired_token_is_refused(self, client: TestClient, session: Session) -> None:
        token = create_enrollment_token(session)
        session.execute(
            update(EnrollmentToken).values(expires_at=datetime.now(UTC) - timedelta(minutes=1))
        )
        response = client.post("/api/v1/nodes", json={"enrollment_token": token, "hostname": "a"})
        assert response.status_code == 401

    def test_bad_hostname_is_a_422_naming_the_field(
        self, client: TestClient, session: Session
    ) -> None:
        token = create_enrollment_token(session)
        response = client.post(
            "/api/v1/nodes", json={"enrollment_token": token, "hostname": "bad host!"}
        )
        assert response.status_code == 422
        body = response.json()
        assert body["error"] == "validation_error"
        assert ["body", "hostname"] in [field["loc"] for field in body["fields"]]
        assert "hostname" in body["detail"]


class TestListNodes:
    def test_viewer_lists_and_filters_by_label(self, client: TestClient, session: Session) -> None:
        create_node(session, hostname="web-1", labels={"tier": "web"})
        create_node(session, hostname="db-1", labels={"tier": "db"})
        viewer = create_api_token(session, role=Role.VIEWER)
        everyone = client.get("/api/v1/nodes", headers=bearer(viewer)).json()
        assert [node["hostname"] for node in everyone] == ["db-1", "web-1"]
        web = client.get("/api/v1/nodes", params={"label": "tier=web"}, headers=bearer(viewer))
        assert [node["hostname"] for node in web.json()] == ["web-1"]

    def test_malformed_label_filter_is_422(self, client: TestClient, session: Session) -> None:
        viewer = create_api_token(session, role=Role.VIEWER)
        response = client.get("/api/v1/nodes", params={"label": "tier"}, headers=bearer(viewer))
        assert response.status_code == 422

    def test_without_token_is_401(self, client: TestClient) -> None:
        response = client.get("/api/v1/nodes")
        assert response.status_code == 401
        assert response.json() == {
            "error": "unauthorized",
            "detail": "missing bearer token (Authorization: Bearer <token>)",
            "fields": [],
        }

    def test_wrong_token_is_401(self, client: TestClient) -> None:
        for token in ("bpo_not-a-real-token", "bpn_not-a-real-token", "garbage"):
            assert client.get("/api/v1/nodes", headers=bearer(token)).status_code == 401

    def test_revoked_token_is_401(self, client: TestClient, session: Session) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        created = client.post(
            "/api/v1/api-tokens",
            json={"name": "short-lived", "role": "viewer"},
            headers=bearer(admin),
        ).json()
        assert client.get("/api/v1/nodes", headers=bearer(created["token"])).status_code == 200
        client.delete(f"/api/v1/api-tokens/{created['id']}", headers=bearer(admin))
        assert client.get("/api/v1/nodes", headers=bearer(created["token"])).status_code == 401

    def test_node_token_is_403(self, client: TestClient, session: Session) -> None:
        _, node_token = create_node(session)
        response = client.get("/api/v1/nodes", headers=bearer(node_token))
        assert response.status_code == 403
        assert response.json()["error"] == "forbidden"


class TestGetNode:
    def test_unknown_id_is_404(self, client: TestClient, session: Session) -> None:
        viewer = create_api_token(session, role=Role.VIEWER)
        response = client.get(
            "/api/v1/nodes/00000000-0000-0000-0000-000000000000", headers=bearer(viewer)
        )
        assert response.status_code == 404
        assert response.json()["error"] == "not_found"

    def test_malformed_id_is_422(self, client: TestClient, session: Session) -> None:
        viewer = create_api_token(session, role=Role.VIEWER)
        response = client.get("/api/v1/nodes/not-a-uuid", headers=bearer(viewer))
        assert response.status_code == 422
        assert response.json()["fields"][0]["loc"] == ["path", "node_id"]

    def test_node_reads_itself_not_others(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session, hostname="a")
        other, _ = create_node(session, hostname="b")
        assert client.get(f"/api/v1/nodes/{node.id}", headers=bearer(token)).status_code == 200
        assert client.get(f"/api/v1/nodes/{other.id}", headers=bearer(token)).status_code == 403


class TestHeartbeat:
    def test_updates_last_seen_and_versions(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        before = node.last_seen_at
        response = client.post(
            f"/api/v1/nodes/{node.id}/heartbeat",
            json={"agent_version": "9.9.9", "kernel_version": "6.1.0-18-amd64"},
            headers=bearer(token),
        )
        assert response.status_code == 200
        body = response.json()
        assert body["agent_version"] == "9.9.9"
        assert body["kernel_version"] == "6.1.0-18-amd64"
        assert before is not None
        assert datetime.fromisoformat(body["last_seen_at"]) >= before

    def test_for_another_node_is_403(self, client: TestClient, session: Session) -> None:
        _, token = create_node(session, hostname="a")
        other, _ = create_node(session, hostname="b")
        response = client.post(
            f"/api/v1/nodes/{other.id}/heartbeat", json={}, headers=bearer(token)
        )
        assert response.status_code == 403

    def test_operator_token_is_403(self, client: TestClient, session: Session) -> None:
        node, _ = create_node(session)
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.post(f"/api/v1/nodes/{node.id}/heartbeat", json={}, headers=bearer(admin))
        assert response.status_code == 403
