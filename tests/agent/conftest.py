from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent import lab
from agent.config import AgentConfig, PowerConfig
from agent.enrollment import enroll_node
from agent.runner import Agent
from agent.state import NodeState
from tests.agent.fixture_trees import build_fixture_host
from tests.proc import ServiceProcess

LoopFactory = Callable[..., str]


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[LoopFactory]:
    """Create real loop devices on empty files (tmpfs or disk); detached after the test."""
    made: list[tuple[str, Path]] = []

    def make(*, on: str = "tmpfs", size_mb: int = 64, direct_io: bool = True) -> str:
        directory = lab.TMPFS if on == "tmpfs" else tmp_path
        backing = directory / f"blkpilot-test-{uuid.uuid4().hex[:8]}.img"
        name = lab.attach(backing, size_mb << 20, direct_io=direct_io)
        made.append((name, backing))
        return name

    yield make
    for name, backing in made:
        lab.detach(name, backing)


@pytest.fixture
def fixture_host(tmp_path: Path) -> Path:
    return build_fixture_host(tmp_path / "host")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    """A real `blkpilot serve` on its own embedded database, with an admin token."""
    (tmp_path / "service").mkdir()
    svc = ServiceProcess(tmp_path / "service")
    svc.start()
    svc.create_admin()
    yield svc
    if svc.process is not None:
        assert svc.stop() == 0


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
