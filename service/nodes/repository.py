from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import psycopg
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from service.tables import Node

# a node's tokens changed (revoked, renewed): every `serve` listening drops what it kept of them
TOKEN_CHANNEL = "blkpilot_node_tokens"


def announce_token_change(session: Session, node_id: uuid.UUID) -> None:
    """Told to every listener when (and only if) the session's transaction commits."""
    session.execute(select(func.pg_notify(TOKEN_CHANNEL, str(node_id))))


def listen_for_token_changes(connection: psycopg.Connection[object]) -> None:
    """On an autocommit connection: its notifies() then yields each announcement."""
    connection.execute(f"LISTEN {TOKEN_CHANNEL}")


def probe(connection: psycopg.Connection[object], payload: str) -> None:
    """A notice on the channel from the listening connection itself: heard back only if the
    connection really listens (not, say, behind a pooler that hands each statement to another
    server connection)."""
    connection.execute("SELECT pg_notify(%s, %s)", (TOKEN_CHANNEL, payload))


def get(session: Session, node_id: uuid.UUID, *, lock: bool = False) -> Node | None:
    return session.get(Node, node_id, with_for_update=lock)


def get_by_token_digest(session: Session, digest: str) -> Node | None:
    """The node whose token, or whose token before the last rotation, has this digest."""
    return session.scalar(
        select(Node).where(or_(Node.token_sha256 == digest, Node.previous_token_sha256 == digest))
    )


def list_nodes(
    session: Session,
    *,
    hostname: str | None,
    label: tuple[str, str] | None,
    limit: int,
    offset: int,
) -> Sequence[Node]:
    query = select(Node).order_by(Node.hostname, Node.id).limit(limit).offset(offset)
    if hostname is not None:
        query = query.where(Node.hostname == hostname)
    if label is not None:
        query = query.where(Node.labels.contains({label[0]: label[1]}))
    return session.scalars(query).all()


def add(
    session: Session,
    *,
    hostname: str,
    labels: dict[str, str],
    digest: str,
    expires_at: datetime,
    agent_version: str,
    kernel_version: str,
    now: datetime,
) -> Node:
    node = Node(
        hostname=hostname,
        labels=labels,
        token_sha256=digest,
        token_expires_at=expires_at,
        agent_version=agent_version,
        kernel_version=kernel_version,
        last_seen_at=now,
    )
    session.add(node)
    session.flush()
    return node


def touch(session: Session, node: Node, now: datetime) -> None:
    node.last_seen_at = now
    session.flush()
