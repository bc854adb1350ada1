from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agent.errors import NotEnrolled
from agent.state import NodeState


def test_round_trip_private_and_atomic(tmp_path: Path) -> None:
    state = NodeState("http://127.0.0.1:8000", uuid.uuid4(), "bpn_secret", "node-a")
    path = state.save(tmp_path / "agent")
    assert path.stat().st_mode & 0o777 == 0o600
    assert NodeState.load(tmp_path / "agent") == state
    assert [p.name for p in (tmp_path / "agent").iterdir()] == ["node.json"]


def test_missing_state_says_how_to_enroll(tmp_path: Path) -> None:
    with pytest.raises(NotEnrolled, match="blkpilot agent enroll"):
        NodeState.load(tmp_path)
