"""A local Ray that does not come up is stopped and started again: Ray gives its raylet a
fixed 30 s to register, which a loaded CI runner has missed. The failure is injected into a
real Ray start (its node lookup raises once, after every process has started); what that
start left running must be gone and the next start must run tasks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import ray
import ray._private.services as ray_services

from models import distributed
from models.distributed import ray_map, ray_session


def _square(n: int) -> int:
    return n * n


def _ray_children() -> set[int]:
    home = os.path.dirname(ray.__file__)
    return {pid for pid in distributed._children() if home in distributed._cmdline(pid)}


@pytest.mark.timeout(300)
def test_a_local_ray_that_does_not_come_up_is_stopped_and_started_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not ray.is_initialized()
    real_get_node = ray_services.get_node
    failed_start: set[int] = set()

    def first_start_fails(*args: object, **kwargs: object) -> object:
        monkeypatch.setattr(ray_services, "get_node", real_get_node)
        failed_start.update(_ray_children())  # what the start had running when it failed
        raise OSError("injected: the raylet did not register")

    monkeypatch.setattr(ray_services, "get_node", first_start_fails)
    with ray_session(num_cpus=1) as where:
        assert failed_start, "the injected failure did not happen after Ray's processes started"
        # the failed start's GCS, raylet, monitors and dashboard are stopped and reaped
        assert not failed_start & set(distributed._children())
        assert where == "a local Ray (1 CPUs)"
        assert ray_map(_square, [1, 2, 3]) == [1, 4, 9]
        running = _ray_children()
        assert running
    assert not ray.is_initialized()
    assert not running & _ray_children()


def test_a_bad_argument_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    starts: list[object] = []
    real_init = ray.init

    def counting_init(*args: Any, **kwargs: Any) -> Any:
        starts.append(kwargs.get("num_cpus"))
        return real_init(*args, **kwargs)

    monkeypatch.setattr(ray, "init", counting_init)
    with pytest.raises(ValueError, match="nonnegative"), ray_session(num_cpus=-1):
        pass
    assert starts == [-1]
    assert not ray.is_initialized()


@pytest.mark.timeout(300)
def test_a_local_ray_allows_its_one_node_a_minute_of_missed_health_checks() -> None:
    """The job's local Ray is started with LOCAL_SYSTEM_CONFIG: its GCS reads it (Ray's own
    5 missed checks, 15 s, had the raylet of a nightly job declared dead on a loaded CI host)."""
    with ray_session(num_cpus=1):
        threshold = ray._config.health_check_failure_threshold()
        period_ms = ray._config.health_check_period_ms()
        assert ray_map(_square, [3]) == [9]
    assert threshold * period_ms >= 60_000
    assert threshold == distributed.LOCAL_SYSTEM_CONFIG["health_check_failure_threshold"]


def test_rays_token_is_its_owners_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray writes ~/.ray/auth_token 0644 the first time it starts (issue 67): the job makes it
    0600 and its directory 0700, before Ray reads it and after Ray wrote it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir(mode=0o755)
    token.write_text("as ray writes it")
    token.chmod(0o644)
    distributed._keep_ray_token_private()
    assert token.stat().st_mode & 0o777 == 0o600
    assert token.parent.stat().st_mode & 0o777 == 0o700
    token.unlink()
    distributed._keep_ray_token_private()  # none yet: nothing to do, no error


def _fails_on_two(n: int) -> int:
    if n == 2:
        raise ValueError("two")
    return n


def test_the_pool_keeps_ray_maps_contract() -> None:
    """Issue 66: where Ray cannot start (a loaded 2-core host), the evaluation runs on a
    pool of processes: results in the items' order, every task's end reported, and a task's
    exception raised after all have ended."""
    seen: list[tuple[int, int]] = []
    assert distributed.pool_map(_square, [3, 1, 2], on_done=lambda d, t: seen.append((d, t))) == [
        9,
        1,
        4,
    ]
    assert seen == [(1, 3), (2, 3), (3, 3)]
    with pytest.raises(ValueError, match="two"):
        distributed.pool_map(_fails_on_two, [1, 2, 3])
    # a closure, as models.evaluate's tasks are (the pool's own pickle refused them, and
    # `bench.policy_eval --no-ray` with them)
    offset = 10
    assert distributed.pool_map(lambda x: x + offset, [1, 2]) == [11, 12]


def test_a_ray_that_cannot_start_leaves_the_pool_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("injected: no Ray here")

    monkeypatch.setattr(distributed, "_start_local", broken)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with distributed.mapper_session() as (where, mapper):
        assert mapper is distributed.pool_map
        assert "Ray could not start" in where
        assert "injected" in where
        assert mapper(_square, [2]) == [4]
    with distributed.mapper_session(use_ray=False) as (where, mapper):
        assert (mapper, "Ray not asked for" in where) == (distributed.pool_map, True)
