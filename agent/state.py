"""The node's identity on disk: which service it enrolled with, its node token, and when that
token expires and should be renewed; and the devices whose policy is paused on the node."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.client import ServiceClient
from agent.errors import NotEnrolled, StateUnreadable
from agent.fsutil import read_json, write_json_atomic

STATE_FILE = "node.json"


@dataclass(frozen=True)
class NodeState:
    server_url: str
    node_id: uuid.UUID
    node_token: str
    hostname: str
    token_expires_at: datetime | None = None  # None: the service did not say
    renew_after: datetime | None = None
    ca_bundle: Path | None = None  # the CAs the service's certificate must chain to

    def client(self, *, max_wait_s: float = 60.0) -> ServiceClient:
        """A client for the service this node enrolled with, as this node."""
        return ServiceClient(
            self.server_url, self.node_token, ca_bundle=self.ca_bundle, max_wait_s=max_wait_s
        )

    def save(self, state_dir: Path) -> Path:
        """Atomically, readable by root only: the token is a credential."""
        target = state_dir / STATE_FILE
        data = {**asdict(self), "node_id": str(self.node_id)}
        for key in ("token_expires_at", "renew_after"):
            when = getattr(self, key)
            data[key] = when.isoformat() if when is not None else None
        data["ca_bundle"] = str(self.ca_bundle) if self.ca_bundle is not None else None
        write_json_atomic(target, data)
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
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise _unreadable(path, str(error)) from None
        try:
            return cls(
                server_url=str(data["server_url"]),
                node_id=uuid.UUID(str(data["node_id"])),
                node_token=str(data["node_token"]),
                hostname=str(data["hostname"]),
                token_expires_at=_when(data.get("token_expires_at")),
                renew_after=_when(data.get("renew_after")),
                ca_bundle=Path(data["ca_bundle"]) if data.get("ca_bundle") else None,
            )
        except KeyError as error:
            raise _unreadable(path, f"it has no {error.args[0]!r}") from None
        except (AttributeError, TypeError, ValueError) as error:
            raise _unreadable(path, str(error) or type(error).__name__) from None


def _unreadable(path: Path, why: str) -> StateUnreadable:
    return StateUnreadable(
        f"the node's state file {path} is unreadable ({why}): restore it from a backup, or"
        " re-enrol the node with `blkpilot agent enroll` (a new enrollment token from the"
        f" service's operator); exit status {StateUnreadable.exit_status}, which the agent's"
        " systemd unit does not restart"
    )


def _when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


class PausedPolicies:
    """Devices whose policy an operator paused on the node by rolling back by hand
    (`blkpilot agent rollback`): the agent neither re-applies the policy nor reports the
    device as drifted, and says it is paused, until the service's policy for it changes (a
    newer version) or `blkpilot agent resume DEVICE`. One JSON file in the state directory,
    read by the running agent at every policy sync."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "paused.json"

    def load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        try:
            found = read_json(self.path)
        except ValueError:
            return {}
        return {str(k): dict(v) for k, v in dict(found).items() if isinstance(v, dict)}

    def pause(self, device: str, version: int | None, why: str) -> None:
        paused = self.load()
        paused[device] = {"version": version, "why": why, "at": datetime.now(UTC).isoformat()}
        write_json_atomic(self.path, paused)

    def resume(self, device: str) -> bool:
        paused = self.load()
        if paused.pop(device, None) is None:
            return False
        write_json_atomic(self.path, paused)
        return True
