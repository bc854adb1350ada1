"""A `serve` process keeps what a node token is and which devices its node has between pushes
(service.nodes.cache): revoked here, refused at once; revoked through another replica,
refused within the cache's few seconds; a device reported since is found."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from agent.contract.wire import EnrollRequest
from service.nodes import repository as node_repository
from service.nodes import service as node_service
from service.nodes.cache import NODES, NodeCache
from service.nodes.service import DEFAULT_LIFETIME
from service.security import Principal, Role, token_digest
from service.tokens import repository as token_repository
from service.tokens.cache import ApiTokenCache
from service.tokens.listener import APPLICATION_NAME, TokenChangeListener
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
    principal = Principal(name="node:x", node_id=uuid.uuid4(), token_digest="d")
    NODES.remember("d", principal, datetime.now(UTC))  # good until now: no longer
    assert NODES.principal("d", datetime.now(UTC)) is None


def test_a_node_just_enrolled_and_its_devices_are_known_without_a_lookup(
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
    # and its devices from the inventory's commit: the first push needs no lookup either
    node_id = uuid.UUID(enrolled["node"]["id"])
    devices = NODES.devices(node_id)
    assert devices is not None
    assert devices == {d["name"]: uuid.UUID(d["id"]) for d in response.json()["devices"]}

    # an inventory rolled back leaves no map behind
    node, _ = create_node(session)
    rolled_back = node.id
    NODES.clear()
    report_inventory(session, node, device_inventory("loop7"))
    session.rollback()
    assert NODES.devices(rolled_back) is None

    # an enrolment rolled back leaves nothing behind
    request = EnrollRequest(enrollment_token=create_enrollment_token(session), hostname="gone")
    _, secret = node_service.enroll(session, request)
    session.rollback()
    assert NODES.principal(token_digest(secret), datetime.now(UTC)) is None


def _until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_token_change_committed_anywhere_is_heard_and_its_node_forgotten(
    engine: Engine,
) -> None:
    """What another replica commits reaches this one through PostgreSQL (LISTEN/NOTIFY): the
    node is forgotten here within moments, so a principal may be kept past the agent's 30 s
    between pushes; when the listener's connection is lost the cache empties and keeps
    principals only the short TTL until it listens again."""
    cache = NodeCache(ttl_s=10.0, heard_ttl_s=600.0)
    listener = TokenChangeListener(engine, cache, retry_s=0.2, ping_s=0.5)
    listener.start()
    try:
        assert _until(lambda: cache.hearing)
        kept, other = uuid.uuid4(), uuid.uuid4()
        until = datetime.now(UTC) + timedelta(days=1)
        cache.remember("a", Principal(name="node:a", node_id=kept, token_digest="a"), until)
        cache.remember("b", Principal(name="node:b", node_id=other, token_digest="b"), until)

        # announced in a transaction rolled back: nothing is heard
        with Session(engine) as session:
            node_repository.announce_token_change(session, kept)
            session.rollback()
        time.sleep(0.5)
        assert cache.principal("a", datetime.now(UTC)) is not None
        # committed (a revocation or renewal through another replica): heard
        with Session(engine) as session:
            node_repository.announce_token_change(session, kept)
            session.commit()
        assert _until(lambda: cache.principal("a", datetime.now(UTC)) is None, 5.0)
        assert cache.principal("b", datetime.now(UTC)) is not None  # only that node

        # the listener's connection is cut: not hearing, nothing kept, then back
        with engine.connect() as connection:
            cut = connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = :name"
                ),
                {"name": APPLICATION_NAME},
            ).all()
        assert cut, "the listener's connection was not found"
        assert _until(lambda: not cache.hearing, 5.0)
        assert cache.principal("b", datetime.now(UTC)) is None
        assert _until(lambda: cache.hearing)
    finally:
        listener.stop()
    assert not listener.thread.is_alive()
    assert not cache.hearing


def test_operator_tokens_are_kept_only_while_every_change_is_heard(engine: Engine) -> None:
    """An operator's token is kept only while the listener hears: then a rotation or
    revocation committed anywhere (announced on its own channel) empties the cache."""
    cache, api_tokens = NodeCache(), ApiTokenCache(ttl_s=60.0)
    admin = Principal(name="token:admin", role=Role.ADMIN)
    until = datetime.now(UTC) + timedelta(days=1)
    api_tokens.remember("d", admin, until, api_tokens.generation)
    assert api_tokens.principal("d", datetime.now(UTC)) is None  # not hearing: not kept
    listener = TokenChangeListener(engine, cache, api_tokens, retry_s=0.2)
    listener.start()
    try:
        assert _until(lambda: api_tokens.hearing)
        api_tokens.remember("d", admin, until, api_tokens.generation)
        assert api_tokens.principal("d", datetime.now(UTC)) == admin
        assert api_tokens.principal("d", until) is None  # never past its expiry
        api_tokens.remember("d", admin, until, api_tokens.generation)
        with Session(engine) as session:
            token_repository.announce_api_token_change(session)
            session.commit()
        assert _until(lambda: api_tokens.principal("d", datetime.now(UTC)) is None, 5.0)
    finally:
        listener.stop()
    assert not api_tokens.hearing


def test_a_listener_that_does_not_hear_its_own_probe_never_claims_to_hear(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a pooler in transaction mode LISTEN succeeds and hears nothing: the listener
    must not then keep principals for ten minutes. Its probes are swallowed here."""
    probes: list[str] = []
    monkeypatch.setattr(
        node_repository, "probe", lambda _connection, payload: probes.append(payload)
    )
    cache = NodeCache(ttl_s=10.0, heard_ttl_s=600.0)
    listener = TokenChangeListener(engine, cache, retry_s=0.1, probe_wait_s=0.3)
    listener.start()
    try:
        assert _until(lambda: len(probes) >= 3)  # given up on, and tried again
        assert not cache.hearing
    finally:
        listener.stop()


def test_revoking_and_renewing_announce_the_change(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both go through the one place that forgets a node, which announces it to the other
    replicas in the same transaction."""
    announced: list[uuid.UUID] = []
    original = node_repository.announce_token_change

    def recorded(session: Session, node_id: uuid.UUID) -> None:
        announced.append(node_id)
        original(session, node_id)

    monkeypatch.setattr(node_repository, "announce_token_change", recorded)
    renewed, token = create_node(session)
    caller = Principal(
        name=f"node:{renewed.hostname}", node_id=renewed.id, token_digest=token_digest(token)
    )
    node_service.renew_token(session, caller, renewed.id, DEFAULT_LIFETIME)
    assert announced == [renewed.id]
    revoked, _ = create_node(session)
    node_service.revoke(session, Principal(name="token:admin"), revoked.id, "lost host")
    assert announced == [renewed.id, revoked.id]


def test_a_lookup_that_a_change_overtook_is_not_kept() -> None:
    """A request looks a token up, a revocation is heard before it is done, then it would
    keep what it found: it must not (the token it found valid may be the one revoked)."""
    nodes, api_tokens = NodeCache(), ApiTokenCache()
    api_tokens.hear(True)
    node_id = uuid.uuid4()
    node = Principal(name="node:x", node_id=node_id, token_digest="n")
    admin = Principal(name="token:admin", role=Role.ADMIN)
    until = datetime.now(UTC) + timedelta(days=1)

    before = nodes.generation
    nodes.forget_node(node_id)  # heard while the lookup ran
    nodes.remember("n", node, until, before)
    assert nodes.principal("n", datetime.now(UTC)) is None
    nodes.remember("n", node, until, nodes.generation)  # no change meanwhile: kept
    assert nodes.principal("n", datetime.now(UTC)) == node

    before = api_tokens.generation
    api_tokens.clear()
    api_tokens.remember("a", admin, until, before)
    assert api_tokens.principal("a", datetime.now(UTC)) is None
    api_tokens.remember("a", admin, until, api_tokens.generation)
    assert api_tokens.principal("a", datetime.now(UTC)) == admin
