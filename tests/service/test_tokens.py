from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.security import Role, token_digest
from service.tables import ApiToken
from service.tokens import service as token_service
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


class TestApiTokenLifetime:
    """Operators' tokens expire (default 90 days), say when they were last used, and rotate:
    they never expired before (issue 31)."""

    def test_a_new_token_expires_in_90_days_by_default_or_never_if_asked(
        self, client: TestClient, session: Session
    ) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        made = client.post(
            "/api/v1/api-tokens", json={"name": "ci", "role": "viewer"}, headers=bearer(admin)
        ).json()
        expires = datetime.fromisoformat(made["expires_at"])
        assert timedelta(days=89) < expires - datetime.now(UTC) <= timedelta(days=90)
        forever = client.post(
            "/api/v1/api-tokens",
            json={"name": "forever", "role": "viewer", "ttl_hours": None},
            headers=bearer(admin),
        ).json()
        assert forever["expires_at"] is None

    def test_an_expired_token_is_refused_and_says_so(
        self, client: TestClient, session: Session
    ) -> None:
        viewer = create_api_token(session, role=Role.VIEWER, name="old-viewer")
        stored = session.scalars(select(ApiToken).where(ApiToken.name == "old-viewer")).one()
        assert client.get("/api/v1/nodes", headers=bearer(viewer)).status_code == 200
        stored.expires_at = datetime.now(UTC) - timedelta(seconds=1)
        session.flush()
        refused = client.get("/api/v1/nodes", headers=bearer(viewer))
        assert refused.status_code == 401
        assert "expired" in refused.json()["detail"]
        assert "token rotate old-viewer" in refused.json()["detail"]

    def test_last_use_is_recorded(self, client: TestClient, session: Session) -> None:
        viewer = create_api_token(session, role=Role.VIEWER, name="used")
        stored = session.scalars(select(ApiToken).where(ApiToken.name == "used")).one()
        assert stored.last_used_at is None
        assert client.get("/api/v1/nodes", headers=bearer(viewer)).status_code == 200
        session.refresh(stored)
        assert stored.last_used_at is not None
        assert datetime.now(UTC) - stored.last_used_at < timedelta(minutes=1)

    def test_rotation_gives_a_new_secret_and_the_old_one_stops(
        self, client: TestClient, session: Session
    ) -> None:
        viewer = create_api_token(session, role=Role.VIEWER, name="rotated")
        token, secret = token_service.rotate_api_token(session, "tests", "rotated", ttl=None)
        assert (token.name, token.role, token.expires_at) == ("rotated", "viewer", None)
        assert client.get("/api/v1/nodes", headers=bearer(viewer)).status_code == 401
        assert client.get("/api/v1/nodes", headers=bearer(secret)).status_code == 200
        with pytest.raises(NotFound):
            token_service.rotate_api_token(session, "tests", "no-such-token")
