"""Ray for the nightly job and the evaluation: the cluster named by RAY_ADDRESS (or the
`address` given), else a local Ray started for the job and stopped after it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None) -> Iterator[str]:
    """Connect to (or start) Ray; yields where the tasks run. Shuts down only what it
    started."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if ray.is_initialized():
        yield "the Ray session already open"
        return
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
            where = f"the Ray cluster at {address}"
        else:
            # "local": a Ray of the job's own. With no address at all, ray.init joins the
            # newest cluster a `ray start` left on this machine (/tmp/ray/ray_current_cluster)
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
            cpus = int(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
            where = f"a local Ray ({cpus} CPUs)"
    except BaseException:
        # a start that failed half-way (on a loaded host, Ray's agents can miss their start
        # timeout) leaves its processes running: stop what it started
        ray.shutdown()
        raise
    try:
        yield where
    finally:
        ray.shutdown()


def ray_map(
    function: Callable[[T], R],
    items: Sequence[T],
    *,
    on_done: Callable[[int, int], None] | None = None,
    **options: Any,
) -> list[R]:
    """function(item) for every item as a Ray task; results in the items' order. A task's
    exception is raised here (the first one, after every task has ended). `on_done(done,
    total)` is called as tasks end, for whoever waits to see the job move."""
    import ray

    remote = ray.remote(**options)(function) if options else ray.remote(function)
    refs = [remote.remote(item) for item in items]
    if on_done is not None:
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=1)
            on_done(len(refs) - len(pending), len(refs))
    results: list[R] = ray.get(refs)
    return results
