"""A node token's life: it expires, its node renews it (the old one good for a grace period),
and an admin can revoke the node — refused at once, its history kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.nodes.cache import NODES
from service.security import Role, token_digest
from service.tables import Device, Node, TelemetryWindowRow
from tests.factories import (
    bearer,
    create_api_token,
    create_enrollment_token,
    create_node,
    device_inventory,
    report_inventory,
    telemetry_window,
)


def _heartbeat(client: TestClient, node: Node, token: str) -> tuple[int, str]:
    response = client.post(f"/api/v1/nodes/{node.id}/heartbeat", json={}, headers=bearer(token))
    return response.status_code, response.json().get("detail", "")


def _renew(client: TestClient, node: Node, token: str) -> str:
    response = client.post(f"/api/v1/nodes/{node.id}/token", headers=bearer(token))
    assert response.status_code == 201, response.text
    return str(response.json()["node_token"])


def test_enrollment_says_when_the_token_expires_and_when_to_renew(
    client: TestClient, session: Session
) -> None:
    body = {"enrollment_token": create_enrollment_token(session), "hostname": "node-t"}
    enrolled = client.post("/api/v1/nodes", json=body).json()
    expires = datetime.fromisoformat(enrolled["expires_at"])
    renew = datetime.fromisoformat(enrolled["renew_after"])
    now = datetime.now(UTC)
    assert expires - now == pytest.approx(timedelta(days=30), abs=timedelta(minutes=1))
    assert renew - now == pytest.approx(timedelta(days=20), abs=timedelta(minutes=1))
    assert enrolled["node"]["token_expires_at"] == enrolled["expires_at"]
    assert enrolled["node"]["revoked_at"] is None


def test_a_renewed_token_works_and_the_old_one_only_for_the_grace_period(
    client: TestClient, session: Session
) -> None:
    node, old = create_node(session)
    new = _renew(client, node, old)
    assert new != old
    assert _heartbeat(client, node, new)[0] == 200
    assert _heartbeat(client, node, old)[0] == 200  # within the grace period
    session.refresh(node)
    assert node.previous_token_expires_at is not None
    grace = node.previous_token_expires_at - datetime.now(UTC)
    assert timedelta(minutes=9) < grace <= timedelta(minutes=10)
    node.previous_token_expires_at = datetime.now(UTC) - timedelta(seconds=1)  # grace over
    session.flush()
    # serve keeps a checked token until its grace's end (service.nodes.cache): this edit
    # brings the end forward, as time passing would have
    NODES.clear()
    status, detail = _heartbeat(client, node, old)
    assert status == 401
    assert "replaced when the node renewed it" in detail
    assert _heartbeat(client, node, new)[0] == 200


def test_a_renewal_whose_answer_was_lost_is_retried_with_the_old_token(
    client: TestClient, session: Session
) -> None:
    node, old = create_node(session)
    lost = _renew(client, node, old)  # the agent never saw this one
    again = _renew(client, node, old)  # it retries with the token it has
    assert _heartbeat(client, node, again)[0] == 200
    assert _heartbeat(client, node, old)[0] == 200  # still its grace period
    assert _heartbeat(client, node, lost)[0] == 401
    session.refresh(node)
    assert node.previous_token_sha256 == token_digest(old)


def test_an_expired_token_is_refused_with_the_reason(client: TestClient, session: Session) -> None:
    node, token = create_node(session)
    session.commit()  # enrolled (committed, as the endpoint does)
    node.token_expires_at = datetime.now(UTC) - timedelta(seconds=1)
    session.flush()
    # serve knows a token from its enrolment's commit until its expiry (service.nodes.cache):
    # this edit brings the expiry forward, as time passing would have
    NODES.clear()
    status, detail = _heartbeat(client, node, token)
    assert status == 401
    assert "node token expired at" in detail
    assert "enroll again" in detail
    refused = client.post(f"/api/v1/nodes/{node.id}/token", headers=bearer(token))
    assert refused.status_code == 401  # too late to renew


def test_only_the_node_itself_renews_its_token(client: TestClient, session: Session) -> None:
    node, _ = create_node(session, hostname="node-a")
    _, other = create_node(session, hostname="node-b")
    assert client.post(f"/api/v1/nodes/{node.id}/token", headers=bearer(other)).status_code == 403
    admin = create_api_token(session, role=Role.ADMIN)
    assert client.post(f"/api/v1/nodes/{node.id}/token", headers=bearer(admin)).status_code == 403


def test_a_revoked_node_is_refused_at_once_and_its_history_kept(
    client: TestClient, session: Session
) -> None:
    node, old = create_node(session)
    (device,) = report_inventory(session, node, device_inventory("loop0"))
    token = _renew(client, node, old)
    batch = {"batch_id": "9f1d3c1e-0000-4000-8000-000000000001", "windows": [telemetry_window()]}
    stored = client.post("/api/v1/telemetry/batches", json=batch, headers=bearer(token))
    assert stored.status_code == 201, stored.text

    operator = create_api_token(session, role=Role.OPERATOR)
    body = {"reason": "host stolen from the rack"}
    url = f"/api/v1/nodes/{node.id}/revoke"
    assert client.post(url, json=body, headers=bearer(operator)).status_code == 403
    admin = create_api_token(session, role=Role.ADMIN)
    assert client.post(url, json={"reason": ""}, headers=bearer(admin)).status_code == 422
    revoked = client.post(url, json=body, headers=bearer(admin))
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["revoked_at"] is not None

    for used in (token, old):  # the current token, and the one still in its grace period
        status, detail = _heartbeat(client, node, used)
        assert status == 401
        assert "was revoked at" in detail
    again = client.post("/api/v1/telemetry/batches", json=batch, headers=bearer(token))
    assert again.status_code == 401
    assert client.post(url, json=body, headers=bearer(admin)).status_code == 409

    # the history stays: the node, its device and its telemetry, and the audit entry
    listed = client.get(f"/api/v1/nodes/{node.id}", headers=bearer(admin)).json()
    assert listed["revoked_at"] == revoked.json()["revoked_at"]
    assert session.get(Device, device.id) is not None
    assert session.scalar(select(func.count()).select_from(TelemetryWindowRow)) == 1
    audit = client.get(
        "/api/v1/audit", params={"action": "node.revoked"}, headers=bearer(admin)
    ).json()
    assert [entry["detail"] for entry in audit] == ["host stolen from the rack"]
