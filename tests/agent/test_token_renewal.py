"""The agent renews its node token before it expires, against a real service whose tokens
live six seconds, without losing or repeating a telemetry window."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.config import AgentConfig
from agent.runner import Agent
from agent.state import NodeState
from tests.agent.conftest import NO_POWER, LoopFactory, enroll_lab_node
from tests.proc import ServiceProcess

pytestmark = pytest.mark.slow

TTL_S, GRACE_S = 6.0, 1.0


@pytest.fixture
def short_lived(tmp_path: Path) -> Iterator[ServiceProcess]:
    (tmp_path / "service").mkdir()
    svc = ServiceProcess(
        tmp_path / "service",
        settings={
            "BLKPILOT_NODE_TOKEN_TTL_HOURS": str(TTL_S / 3600),
            "BLKPILOT_NODE_TOKEN_GRACE_SECONDS": str(GRACE_S),
        },
    )
    svc.start()
    svc.create_admin()
    yield svc
    if svc.process is not None:
        assert svc.stop() == 0


def test_the_agent_renews_its_token_and_loses_no_window(
    short_lived: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    device = loop_device(on="tmpfs")
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(short_lived, state_dir)
    first_token = node.node_token
    assert node.token_expires_at is not None
    assert node.renew_after is not None
    assert NodeState.load(state_dir).renew_after == node.renew_after
    config = AgentConfig(
        devices=[device], interval_s=0.5, push_interval_s=1.0, metrics_port=0, power=NO_POWER
    )
    agent = Agent(config, node, state_dir)
    agent.start()
    until = time.monotonic() + 3 * TTL_S  # three lifetimes: the first token long expired
    while time.monotonic() < until:
        time.sleep(min(agent.step(), 0.1))
    agent.push()

    assert agent.counters.token_renewals >= 3, agent.counters
    saved = NodeState.load(state_dir)
    assert saved.node_token == agent.state.node_token != first_token  # type: ignore[union-attr]
    assert saved.token_expires_at is not None
    assert saved.token_expires_at.timestamp() > time.time()
    # no window lost or repeated across the renewals
    assert agent.view.spool_batches == 0
    devices = short_lived.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
    stored = short_lived.api(
        "GET", f"/devices/{devices[0]['id']}/telemetry", params={"limit": 10_000}
    ).json()
    assert len(stored) == agent.counters.windows_collected == agent.counters.windows_sent
    assert len({w["window_start"] for w in stored}) == len(stored)
    # the first token is refused now: replaced three times, its grace period long over
    refused = httpx.post(
        f"{short_lived.base_url}/api/v1/nodes/{node.node_id}/heartbeat",
        json={},
        headers={"Authorization": f"Bearer {first_token}"},
    )
    assert refused.status_code == 401, refused.text
