"""A node token's life: issued with an expiry and a time to renew after; rotated by the node
itself (the token it replaces stays good for a grace period); refused once expired, past its
grace, or when the node is revoked. Pure: times and digests in, decisions out."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from service.security import Principal
from service.tables import Node

RENEW_AT = 2 / 3  # of the lifetime: the agent renews then, with a third left for outages


@dataclass(frozen=True)
class Lifetime:
    ttl: timedelta
    grace: timedelta  # how long a rotated-out token is still accepted

    def expiry(self, now: datetime) -> datetime:
        return now + self.ttl

    def renew_after(self, now: datetime) -> datetime:
        return now + self.ttl * RENEW_AT


def refusal(node: Node, digest: str, now: datetime) -> str | None:
    """Why this token of this node is refused now, or None if it is good."""
    if node.revoked_at is not None:
        return f"node {node.id} was revoked at {node.revoked_at.isoformat()}"
    if digest == node.token_sha256:
        if now >= node.token_expires_at:
            return (
                f"node token expired at {node.token_expires_at.isoformat()};"
                " the node must enroll again"
            )
        return None
    if digest == node.previous_token_sha256:
        ended = node.previous_token_expires_at
        if ended is None or now >= ended:
            return "node token was replaced when the node renewed it; use the new one"
        return None
    return "unknown token"


def good_until(node: Node, digest: str) -> datetime:
    """Until when this token of this node is good, if nothing else happens (revocation,
    another renewal): its expiry, or its grace's end if it is the previous one."""
    if digest == node.token_sha256:
        return node.token_expires_at
    ended = node.previous_token_expires_at
    return ended if ended is not None else node.token_expires_at


def rotate(
    node: Node, new_digest: str, used_digest: str, lifetime: Lifetime, now: datetime
) -> None:
    """The node's new token is `new_digest`. The one the node called with stays good for the
    grace period — unless it called with the previous token (its last renewal's answer was
    lost): then the previous keeps its own grace, and the token it never saw is dropped."""
    if used_digest == node.token_sha256:
        node.previous_token_sha256 = node.token_sha256
        node.previous_token_expires_at = min(now + lifetime.grace, node.token_expires_at)
    node.token_sha256 = new_digest
    node.token_expires_at = lifetime.expiry(now)


class NodeNamed(Protocol):
    """A node as a principal names it: a Node, or a node's row."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def hostname(self) -> str: ...


def principal_of(node: NodeNamed, digest: str) -> Principal:
    """Who a call made with this token of this node is."""
    return Principal(
        name=f"node:{node.hostname}/{str(node.id)[:8]}", node_id=node.id, token_digest=digest
    )
