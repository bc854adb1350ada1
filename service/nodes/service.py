from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from agent.contract.wire import EnrollRequest, Heartbeat
from service.audit import service as audit
from service.errors import Conflict, Forbidden, NotFound, Unauthorized, Unprocessable
from service.nodes import repository
from service.nodes.cache import NODES
from service.nodes.tokens import Lifetime, principal_of, rotate
from service.ops.transactions import on_commit
from service.security import NODE_TOKEN_PREFIX, Principal, Role, new_token, token_digest
from service.tables import Node

DEFAULT_LIFETIME = Lifetime(timedelta(days=30), timedelta(minutes=10))


def enroll(
    session: Session, request: EnrollRequest, lifetime: Lifetime = DEFAULT_LIFETIME
) -> tuple[Row[Any], str]:
    """Trade a one-time enrollment token for a node and its own token: the node's row (what
    NodeRead reads) and the token."""
    now = datetime.now(UTC)
    secret = new_token(NODE_TOKEN_PREFIX)
    digest = token_digest(secret)
    # labels from the enrollment token (set by an admin) win over labels the node claims
    node = repository.enroll(
        session,
        enrollment_digest=token_digest(request.enrollment_token),
        hostname=request.hostname,
        labels=request.labels,
        digest=digest,
        expires_at=lifetime.expiry(now),
        agent_version=request.agent_version,
        kernel_version=request.kernel_version,
        now=now,
    )
    if node is None:
        raise Unauthorized("enrollment token is unknown, already used or expired")
    principal, valid_until = principal_of(node, digest), node.token_expires_at
    # the agent's next call, its inventory, comes with this token at once: known to this
    # process from the commit on, as a token checked here is (a lookup in a unit of work of
    # its own saved, one of enrolment's costs; bench.fleet)
    on_commit(session, lambda: NODES.remember(digest, principal, valid_until))
    # one INSERT without RETURNING (nothing of the event is read back), as an inventory's
    audit.record_many(
        session,
        principal.name,
        "node.enrolled",
        [
            {
                "target_type": "node",
                "target_id": node.id,
                "after": {
                    "hostname": node.hostname,
                    "labels": node.labels,
                    "enrollment_token": str(node.enrollment_token_id),
                },
            }
        ],
    )
    return node, secret


def renew_token(
    session: Session, node: Principal, node_id: uuid.UUID, lifetime: Lifetime
) -> tuple[Node, str]:
    """A new token for the calling node; the one it called with stays good for the grace
    period. Only a node renews, and only its own."""
    if node.node_id != node_id:
        raise Forbidden("a node may renew only its own token")
    found = repository.get(session, node_id, lock=True)
    if found is None:
        raise NotFound(f"no node {node_id}")
    now = datetime.now(UTC)
    secret = new_token(NODE_TOKEN_PREFIX)
    rotate(found, token_digest(secret), node.token_digest, lifetime, now)
    _forget(session, found.id)  # the previous token's grace now ends sooner
    repository.touch(session, found, now)
    audit.record(
        session,
        node.name,
        "node.token_renewed",
        target_type="node",
        target_id=found.id,
        after={"expires_at": found.token_expires_at.isoformat()},
    )
    return found, secret


def revoke(session: Session, by: Principal, node_id: uuid.UUID, reason: str) -> Node:
    """Refuse the node's tokens from now on; its devices, telemetry and history stay."""
    found = repository.get(session, node_id, lock=True)
    if found is None:
        raise NotFound(f"no node {node_id}")
    if found.revoked_at is not None:
        raise Conflict(f"node {node_id} was already revoked at {found.revoked_at.isoformat()}")
    found.revoked_at = datetime.now(UTC)  # both its tokens are refused, saying why
    session.flush()
    _forget(session, found.id)
    audit.record(
        session,
        by.name,
        "node.revoked",
        target_type="node",
        target_id=found.id,
        detail=reason,
        after={"revoked_at": found.revoked_at.isoformat()},
    )
    return found


def get_node(session: Session, principal: Principal, node_id: uuid.UUID) -> Node:
    if not principal.may_act_for_node(node_id, Role.VIEWER):
        raise Forbidden("a node may read only itself")
    node = repository.get(session, node_id)
    if node is None:
        raise NotFound(f"no node {node_id}")
    return node


def list_nodes(
    session: Session, *, hostname: str | None, label: str | None, limit: int, offset: int
) -> Sequence[Node]:
    selector: tuple[str, str] | None = None
    if label is not None:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise Unprocessable("label filter must look like key=value")
        selector = (key, value)
    return repository.list_nodes(
        session, hostname=hostname, label=selector, limit=limit, offset=offset
    )


def heartbeat(session: Session, node: Principal, node_id: uuid.UUID, beat: Heartbeat) -> Node:
    if node.node_id != node_id:
        raise Forbidden("a node may send heartbeats only for itself")
    found = get_node(session, node, node_id)
    if beat.agent_version is not None:
        found.agent_version = beat.agent_version
    if beat.kernel_version is not None:
        found.kernel_version = beat.kernel_version
    repository.touch(session, found, datetime.now(UTC))
    return found


def _forget(session: Session, node_id: uuid.UUID) -> None:
    """This process's cache of the node's tokens and devices: dropped now, and again once the
    change has committed (a request between the two would otherwise keep the old state); every
    other replica's, when they hear of the commit (service.tokens.listener)."""
    NODES.forget_node(node_id)
    on_commit(session, lambda: NODES.forget_node(node_id))
    repository.announce_token_change(session, node_id)
