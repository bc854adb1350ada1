from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import Row, cast, func, literal, or_, select, true, update
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.orm import Session

from service.tables import EnrollmentToken, Node

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


def enroll(
    session: Session,
    *,
    enrollment_digest: str,
    hostname: str,
    labels: dict[str, str],
    digest: str,
    expires_at: datetime,
    agent_version: str,
    kernel_version: str,
    now: datetime,
) -> Row[Any] | None:
    """Claim the unused, unexpired enrollment token with this digest for a new node, and add
    the node, in one statement: the claim (an UPDATE, so two nodes racing with one token cannot
    both win) names the node it is for, and the node is inserted from the claimed row, with the
    token's labels over the node's own. Returns the node's row with `enrollment_token_id` and
    the token's `enrollment_labels`, or None (nothing written) if no token was claimed.

    The token's foreign key to the node holds: PostgreSQL checks it at the end of the
    statement, when the node's row is there."""
    node_id = uuid.uuid4()
    claimed = (
        update(EnrollmentToken)
        .where(
            EnrollmentToken.token_sha256 == enrollment_digest,
            EnrollmentToken.used_at.is_(None),
            EnrollmentToken.expires_at > now,
        )
        .values(used_at=now, used_by_node_id=node_id)
        .returning(EnrollmentToken.id, EnrollmentToken.labels)
        .cte("claimed")
    )
    added = (
        insert(Node)
        .from_select(
            [
                "id",
                "hostname",
                "labels",
                "token_sha256",
                "token_expires_at",
                "agent_version",
                "kernel_version",
                "last_seen_at",
            ],
            select(
                literal(node_id),
                literal(hostname),
                cast(literal(labels, JSONB), JSONB).op("||")(claimed.c.labels),
                literal(digest),
                literal(expires_at),
                literal(agent_version),
                literal(kernel_version),
                literal(now),
            ),
        )
        .returning(*Node.__table__.c)
        .cte("added")
    )
    return session.execute(
        select(
            added,
            claimed.c.id.label("enrollment_token_id"),
            claimed.c.labels.label("enrollment_labels"),
        ).select_from(added.join(claimed, true()))
    ).one_or_none()


def touch(session: Session, node: Node, now: datetime) -> None:
    node.last_seen_at = now
    session.flush()
