"""A `serve` process keeps what a node token is and which devices its node has between pushes
(service.nodes.cache): revoked here, refused at once; revoked through another replica,
refused within the cache's few seconds; a device reported since is found."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from agent.contract.wire import EnrollRequest
from service.nodes import service as node_service
from service.nodes.cache import NODES
from service.security import token_digest
from tests.factories import (
    bearer,
    create_enrollment_token,
    create_node,
    device_inventory,
    report_inventory,
    telemetry_window,
)


def _push(client: TestClient, token: str, *windows: dict[str, object]) -> int:
    batch = {"batch_id": str(uuid.uuid4()), "windows": list(windows)}
    response = client.post("/api/v1/telemetry/batches", json=batch, headers=bearer(token))
    return int(response.status_code)


def test_a_node_revoked_through_another_replica_is_refused_within_the_ttl(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(NODES, "ttl_s", 60.0)  # long enough for a busy host's two pushes
    node, token = create_node(session)
    report_inventory(session, node, device_inventory("loop0"))
    assert _push(client, token, telemetry_window(index=0)) == 201
    assert NODES.principal(token_digest(token), datetime.now(UTC)) is not None  # kept

    # another replica revokes it: this process's service never hears of it
    node.revoked_at = datetime.now(UTC)
    session.flush()
    # inside the TTL the cached principal still answers (documented: up to 10 s)
    assert _push(client, token, telemetry_window(index=1)) == 201
    monkeypatch.setattr(NODES, "ttl_s", 0.0)  # the TTL passes
    time.sleep(0.01)
    assert _push(client, token, telemetry_window(index=2)) == 401


def test_a_device_reported_after_the_map_was_kept_is_found(
    client: TestClient, session: Session
) -> None:
    node, token = create_node(session)
    report_inventory(session, node, device_inventory("loop0"))
    assert _push(client, token, telemetry_window("loop0")) == 201
    assert set(NODES.devices(node.id) or {}) == {"loop0"}
    # its inventory grows (through any replica): the next push names the new device
    report_inventory(session, node, device_inventory("loop0"), device_inventory("loop1"))
    assert _push(client, token, telemetry_window("loop1")) == 201
    assert set(NODES.devices(node.id) or {}) == {"loop0", "loop1"}
    # a name the node never reported is still refused, after a look in the database
    assert _push(client, token, telemetry_window("loop9", index=1)) == 422


def test_a_cached_token_is_not_used_past_its_expiry() -> None:
    from service.security import Principal

    principal = Principal(name="node:x", node_id=uuid.uuid4(), token_digest="d")
    NODES.remember("d", principal, datetime.now(UTC))  # good until now: no longer
    assert NODES.principal("d", datetime.now(UTC)) is None


def test_a_node_just_enrolled_is_known_without_a_lookup(
    client: TestClient, session: Session
) -> None:
    """Enrolment is three calls, and the third (the inventory) comes with the node token at
    once: the token is known to this process from the enrolment's commit, as a checked one is
    (bench.fleet: a unit of work of its own saved per node) — and not before it commits."""
    body = {"enrollment_token": create_enrollment_token(session), "hostname": "node-new"}
    response = client.post("/api/v1/nodes", json=body)
    assert response.status_code == 201, response.text
    enrolled = response.json()
    digest = token_digest(enrolled["node_token"])
    known = NODES.principal(digest, datetime.now(UTC))
    assert known is not None
    assert known.node_id == uuid.UUID(enrolled["node"]["id"])
    assert known.name == f"node:node-new/{enrolled['node']['id'][:8]}"
    report = {"devices": [device_inventory("loop0").model_dump(mode="json")]}
    response = client.put(
        f"/api/v1/nodes/{enrolled['node']['id']}/inventory",
        json=report,
        headers=bearer(enrolled["node_token"]),
    )
    assert response.status_code == 200, response.text

    # an enrolment rolled back leaves nothing behind
    request = EnrollRequest(enrollment_token=create_enrollment_token(session), hostname="gone")
    _, secret = node_service.enroll(session, request)
    session.rollback()
    assert NODES.principal(token_digest(secret), datetime.now(UTC)) is None
