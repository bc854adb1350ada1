from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from service.audit import service as audit
from service.errors import Conflict, NotFound
from service.security import (
    ENROLLMENT_TOKEN_PREFIX,
    OPERATOR_TOKEN_PREFIX,
    Principal,
    Role,
    new_token,
    token_digest,
)
from service.tables import ApiToken, EnrollmentToken
from service.tokens import repository


def create_api_token(
    session: Session, actor: Principal | str, *, name: str, role: Role
) -> tuple[ApiToken, str]:
    """Returns the stored token and its secret, which is never stored nor shown again."""
    if repository.get_api_token_by_name(session, name) is not None:
        raise Conflict(f"an API token named {name!r} already exists")
    secret = new_token(OPERATOR_TOKEN_PREFIX)
    created_by = actor if isinstance(actor, str) else actor.name
    token = repository.add_api_token(
        session, name=name, role=role.value, digest=token_digest(secret), created_by=created_by
    )
    audit.record(
        session,
        actor,
        "api_token.created",
        target_type="api_token",
        target_id=token.id,
        after={"name": name, "role": role.value},
    )
    return token, secret


def list_api_tokens(session: Session) -> Sequence[ApiToken]:
    return repository.list_api_tokens(session)


def revoke_api_token(session: Session, actor: Principal, token_id: uuid.UUID) -> ApiToken:
    token = repository.get_api_token(session, token_id)
    if token is None:
        raise NotFound(f"no API token {token_id}")
    if token.revoked_at is None:
        token.revoked_at = datetime.now(UTC)
        session.flush()
        audit.record(
            session,
            actor,
            "api_token.revoked",
            target_type="api_token",
            target_id=token.id,
            before={"name": token.name, "role": token.role},
        )
    return token


def create_enrollment_token(
    session: Session,
    actor: Principal | str,
    *,
    labels: dict[str, str],
    ttl: timedelta,
) -> tuple[EnrollmentToken, str]:
    secret = new_token(ENROLLMENT_TOKEN_PREFIX)
    token = repository.add_enrollment_token(
        session,
        digest=token_digest(secret),
        labels=labels,
        created_by=actor if isinstance(actor, str) else actor.name,
        expires_at=datetime.now(UTC) + ttl,
    )
    audit.record(
        session,
        actor,
        "enrollment_token.created",
        target_type="enrollment_token",
        target_id=token.id,
        after={"labels": labels, "expires_at": token.expires_at.isoformat()},
    )
    return token, secret
