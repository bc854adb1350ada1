from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent import lab
from tests.agent.fixture_trees import build_fixture_host

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
