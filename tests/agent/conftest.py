from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentConfig, PowerConfig
from agent.enrollment import enroll_node
from agent.runner import Agent
from agent.state import NodeState
from tests.agent.fixture_trees import build_fixture_host
from tests.conftest import LoopFactory
from tests.proc import ServiceProcess

__all__ = ["NO_POWER", "LoopFactory", "enroll_lab_node"]


@pytest.fixture
def fixture_host(tmp_path: Path) -> Path:
    return build_fixture_host(tmp_path / "host")


NO_POWER = PowerConfig(rapl=False, hwmon=False, ipmi=False)


def enroll_lab_node(
    service: ServiceProcess, state_dir: Path, devices: list[str] | None = None
) -> NodeState:
    """Enroll a node; with devices, also report them, as `agent run` does at start."""
    token = service.api("POST", "/enrollment-tokens", json={}).json()["token"]
    node = enroll_node(service.base_url, token, state_dir, hostname="lab", labels={})
    if devices:
        config = AgentConfig(devices=devices, metrics_port=0, power=NO_POWER)
        Agent(config, node, state_dir).discover_and_report()
    return node
