from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from service.audit import service as audit
from service.errors import Conflict, NotFound
from service.ops.transactions import on_commit
from service.security import (
    ENROLLMENT_TOKEN_PREFIX,
    OPERATOR_TOKEN_PREFIX,
    Principal,
    Role,
    new_token,
    token_digest,
)
from service.tables import ApiToken
from service.tokens import repository
from service.tokens.cache import API_TOKENS

# how long an operator's API token is good for unless told otherwise (`--ttl-hours`,
# `ttl_hours`); None there: it never expires
DEFAULT_API_TOKEN_TTL = timedelta(days=90)


def create_api_token(
    session: Session,
    actor: Principal | str,
    *,
    name: str,
    role: Role,
    ttl: timedelta | None = DEFAULT_API_TOKEN_TTL,
) -> tuple[ApiToken, str]:
    """Returns the stored token and its secret, which is never stored nor shown again."""
    if repository.get_api_token_by_name(session, name) is not None:
        raise Conflict(f"an API token named {name!r} already exists")
    secret = new_token(OPERATOR_TOKEN_PREFIX)
    created_by = actor if isinstance(actor, str) else actor.name
    expires_at = datetime.now(UTC) + ttl if ttl is not None else None
    token = repository.add_api_token(
        session,
        name=name,
        role=role.value,
        digest=token_digest(secret),
        created_by=created_by,
        expires_at=expires_at,
    )
    audit.record(
        session,
        actor,
        "api_token.created",
        target_type="api_token",
        target_id=token.id,
        after={"name": name, "role": role.value, "expires_at": _iso(expires_at)},
    )
    return token, secret


def rotate_api_token(
    session: Session,
    actor: Principal | str,
    name: str,
    *,
    ttl: timedelta | None = DEFAULT_API_TOKEN_TTL,
) -> tuple[ApiToken, str]:
    """A new secret for the token of that name (same name and role); the old secret stops
    working at once. Returns the token and its new secret."""
    token = repository.get_api_token_by_name(session, name)
    if token is None or token.revoked_at is not None:
        raise NotFound(f"no active API token named {name!r}")
    secret = new_token(OPERATOR_TOKEN_PREFIX)
    before = {"expires_at": _iso(token.expires_at)}
    token.token_sha256 = token_digest(secret)
    token.expires_at = datetime.now(UTC) + ttl if ttl is not None else None
    session.flush()
    _forget_api_tokens(session)
    audit.record(
        session,
        actor,
        "api_token.rotated",
        target_type="api_token",
        target_id=token.id,
        before={"name": name, **before},
        after={"name": name, "expires_at": _iso(token.expires_at)},
    )
    return token, secret


def rotate_api_token_by_id(
    session: Session,
    actor: Principal | str,
    token_id: uuid.UUID,
    *,
    ttl: timedelta | None = DEFAULT_API_TOKEN_TTL,
) -> tuple[ApiToken, str]:
    token = repository.get_api_token(session, token_id)
    if token is None:
        raise NotFound(f"no API token {token_id}")
    return rotate_api_token(session, actor, token.name, ttl=ttl)


def _forget_api_tokens(session: Session) -> None:
    """The API tokens this process kept: dropped now and again once the change commits (a
    request between the two would keep the old state); every other replica's when it hears
    of the commit (service.tokens.listener)."""
    API_TOKENS.clear()
    on_commit(session, API_TOKENS.clear)
    repository.announce_api_token_change(session)


def get_api_token_by_name(session: Session, name: str) -> ApiToken:
    token = repository.get_api_token_by_name(session, name)
    if token is None:
        raise NotFound(f"no API token named {name!r}")
    return token


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def list_api_tokens(session: Session) -> Sequence[ApiToken]:
    return repository.list_api_tokens(session)


def revoke_api_token(session: Session, actor: Principal | str, token_id: uuid.UUID) -> ApiToken:
    token = repository.get_api_token(session, token_id)
    if token is None:
        raise NotFound(f"no API token {token_id}")
    if token.revoked_at is None:
        token.revoked_at = datetime.now(UTC)
        session.flush()
        _forget_api_tokens(session)
        audit.record(
            session,
            actor,
            "api_token.revoked",
            target_type="api_token",
            target_id=token.id,
            before={"name": token.name, "role": token.role},
        )
    return token


@dataclass(frozen=True)
class IssuedEnrollmentToken:
    """An enrollment token as created (its secret is returned beside it, shown once)."""

    id: uuid.UUID
    labels: dict[str, str]
    expires_at: datetime


def create_enrollment_token(
    session: Session,
    actor: Principal | str,
    *,
    labels: dict[str, str],
    ttl: timedelta,
) -> tuple[IssuedEnrollmentToken, str]:
    secret = new_token(ENROLLMENT_TOKEN_PREFIX)
    expires_at = datetime.now(UTC) + ttl
    token_id = repository.add_enrollment_token(
        session,
        digest=token_digest(secret),
        labels=labels,
        created_by=actor if isinstance(actor, str) else actor.name,
        expires_at=expires_at,
    )
    audit.record_many(  # one INSERT, nothing read back: one per node a rollout enrols
        session,
        actor,
        "enrollment_token.created",
        [
            {
                "target_type": "enrollment_token",
                "target_id": token_id,
                "after": {"labels": labels, "expires_at": expires_at.isoformat()},
            }
        ],
    )
    return IssuedEnrollmentToken(token_id, labels, expires_at), secret
