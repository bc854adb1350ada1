from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.security import Role, token_digest
from service.tables import ApiToken
from tests.factories import bearer, create_api_token


class TestCreateApiToken:
    def test_admin_creates_a_working_token_stored_only_as_hash(
        self, client: TestClient, session: Session
    ) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.post(
            "/api/v1/api-tokens",
            json={"name": "ops-alice", "role": "operator"},
            headers=bearer(admin),
        )
        assert response.status_code == 201
        secret = response.json()["token"]
        assert secret.startswith("bpo_")
        listed = client.get("/api/v1/api-tokens", headers=bearer(admin)).json()
        assert "ops-alice" in [token["name"] for token in listed]
        assert all("token" not in token for token in listed)
        stored = session.scalars(select(ApiToken).where(ApiToken.name == "ops-alice")).one()
        assert stored.token_sha256 == token_digest(secret)
        assert secret not in stored.token_sha256

    def test_operator_cannot_create_tokens(self, client: TestClient, session: Session) -> None:
        operator = create_api_token(session, role=Role.OPERATOR)
        response = client.post(
            "/api/v1/api-tokens", json={"name": "x", "role": "admin"}, headers=bearer(operator)
        )
        assert response.status_code == 403
        assert "admin" in response.json()["detail"]

    def test_duplicate_name_is_409(self, client: TestClient, session: Session) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        body = {"name": "twice", "role": "viewer"}
        assert (
            client.post("/api/v1/api-tokens", json=body, headers=bearer(admin)).status_code == 201
        )
        second = client.post("/api/v1/api-tokens", json=body, headers=bearer(admin))
        assert second.status_code == 409
        assert second.json()["error"] == "conflict"

    def test_unknown_role_is_422(self, client: TestClient, session: Session) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.post(
            "/api/v1/api-tokens", json={"name": "x", "role": "root"}, headers=bearer(admin)
        )
        assert response.status_code == 422
        assert response.json()["fields"][0]["loc"] == ["body", "role"]


class TestRevokeApiToken:
    def test_unknown_id_is_404(self, client: TestClient, session: Session) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.delete(
            "/api/v1/api-tokens/00000000-0000-0000-0000-000000000000", headers=bearer(admin)
        )
        assert response.status_code == 404


class TestCreateEnrollmentToken:
    def test_admin_only(self, client: TestClient, session: Session) -> None:
        operator = create_api_token(session, role=Role.OPERATOR)
        admin = create_api_token(session, role=Role.ADMIN)
        refused = client.post("/api/v1/enrollment-tokens", json={}, headers=bearer(operator))
        assert refused.status_code == 403
        made = client.post(
            "/api/v1/enrollment-tokens", json={"labels": {"rack": "r2"}}, headers=bearer(admin)
        )
        assert made.status_code == 201
        assert made.json()["token"].startswith("bpe_")
        assert made.json()["labels"] == {"rack": "r2"}

    def test_bad_label_key_is_422(self, client: TestClient, session: Session) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.post(
            "/api/v1/enrollment-tokens", json={"labels": {"Bad Key": "x"}}, headers=bearer(admin)
        )
        assert response.status_code == 422
