"""The node's identity on disk: which service it enrolled with and its node token."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.errors import NotEnrolled
from agent.fsutil import write_json_atomic

STATE_FILE = "node.json"


@dataclass(frozen=True)
class NodeState:
    server_url: str
    node_id: uuid.UUID
    node_token: str
    hostname: str

    def save(self, state_dir: Path) -> Path:
        """Atomically, readable by root only: the token is a credential."""
        target = state_dir / STATE_FILE
        write_json_atomic(target, {**asdict(self), "node_id": str(self.node_id)})
        return target

    @classmethod
    def load(cls, state_dir: Path) -> NodeState:
        path = state_dir / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise NotEnrolled(
                f"not enrolled: {path} does not exist (run `blkpilot agent enroll`)"
            ) from None
        return cls(
            server_url=data["server_url"],
            node_id=uuid.UUID(data["node_id"]),
            node_token=data["node_token"],
            hostname=data["hostname"],
        )
