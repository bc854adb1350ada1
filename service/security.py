"""Tokens: generated with `secrets`, stored only as SHA-256, told apart by their prefix."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

OPERATOR_TOKEN_PREFIX = "bpo_"
# the dashboard's cookie: it holds the operator's API token
SESSION_COOKIE = "blkpilot_ui"
NODE_TOKEN_PREFIX = "bpn_"
ENROLLMENT_TOKEN_PREFIX = "bpe_"


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return list(Role).index(self)

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: an operator's API token, or a node's agent."""

    name: str
    role: Role | None = None  # operators only
    node_id: UUID | None = None  # nodes only
    token_digest: str = ""  # nodes: the token this call was made with (rotation needs it)

    @property
    def is_node(self) -> bool:
        return self.node_id is not None

    def can(self, needed: Role) -> bool:
        return self.role is not None and self.role.allows(needed)

    def may_act_for_node(self, node_id: UUID, needed: Role) -> bool:
        """A node acts only for itself; an operator needs the role."""
        return self.node_id == node_id if self.is_node else self.can(needed)
