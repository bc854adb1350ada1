from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

import psycopg
from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from service.tables import ApiToken, EnrollmentToken

# an operator's API token changed (rotated, revoked): every `serve` listening drops the ones
# it kept (service.tokens.cache)
API_TOKEN_CHANNEL = "blkpilot_api_tokens"


def announce_api_token_change(session: Session) -> None:
    """Told to every listener when (and only if) the session's transaction commits."""
    session.execute(select(func.pg_notify(API_TOKEN_CHANNEL, "*")))


def listen_for_api_token_changes(connection: psycopg.Connection[object]) -> None:
    connection.execute(f"LISTEN {API_TOKEN_CHANNEL}")


def get_active_api_token_by_digest(session: Session, digest: str) -> ApiToken | None:
    """The unrevoked token with this digest (expired or not: the caller says which)."""
    return session.scalar(
        select(ApiToken).where(ApiToken.token_sha256 == digest, ApiToken.revoked_at.is_(None))
    )


# a token's last use is written at most this often: not a row write per request
LAST_USED_RESOLUTION = timedelta(minutes=1)


def touch_api_token(session: Session, token: ApiToken, now: datetime) -> None:
    if token.last_used_at is not None and now - token.last_used_at < LAST_USED_RESOLUTION:
        return
    session.execute(
        update(ApiToken)
        .where(
            ApiToken.id == token.id,
            (ApiToken.last_used_at.is_(None))
            | (ApiToken.last_used_at < now - LAST_USED_RESOLUTION),
        )
        .values(last_used_at=now)
        .execution_options(synchronize_session=False)
    )


def get_api_token_by_name(session: Session, name: str) -> ApiToken | None:
    return session.scalar(select(ApiToken).where(ApiToken.name == name))


def get_api_token(session: Session, token_id: uuid.UUID) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def list_api_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.created_at)).all()


def add_api_token(
    session: Session,
    *,
    name: str,
    role: str,
    digest: str,
    created_by: str,
    expires_at: datetime | None,
) -> ApiToken:
    token = ApiToken(
        name=name, role=role, token_sha256=digest, created_by=created_by, expires_at=expires_at
    )
    session.add(token)
    session.flush()
    return token


def add_enrollment_token(
    session: Session,
    *,
    digest: str,
    labels: dict[str, str],
    created_by: str,
    expires_at: datetime,
) -> uuid.UUID:
    """One INSERT, its id made here and nothing read back (no ORM object made and refreshed:
    one of these per node a rollout enrols); returns the token's id."""
    token_id = uuid.uuid4()
    session.execute(
        insert(EnrollmentToken).values(
            id=token_id,
            token_sha256=digest,
            labels=labels,
            created_by=created_by,
            expires_at=expires_at,
        )
    )
    return token_id


def revoke_by_prefix(session: Session, prefix: str, now: datetime) -> None:
    """Revoke every live API token whose name starts with the prefix."""
    session.execute(
        update(ApiToken)
        .where(ApiToken.name.startswith(prefix), ApiToken.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    announce_api_token_change(session)


def api_token_name_taken(session: Session, name: str) -> bool:
    return session.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None
