"""Ray for the nightly job and the evaluation: the cluster named by RAY_ADDRESS (or the
`address` given), else a local Ray started for the job and stopped after it."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

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
        _keep_ray_token_private()
        if address:
            ray.init(address=address, log_to_driver=False)
            where = f"the Ray cluster at {address}"
        else:
            _start_local(num_cpus)
            cpus = int(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
            where = f"a local Ray ({cpus} CPUs)"
    except BaseException:
        # a start that failed half-way leaves its processes running: stop what it started
        ray.shutdown()
        raise
    _keep_ray_token_private()
    try:
        yield where
    finally:
        ray.shutdown()


def _keep_ray_token_private() -> None:
    """Ray writes the cluster's authentication token to ~/.ray/auth_token readable by every
    user (0644) the first time it starts: it is made the owner's alone (0600, its directory
    0700) before Ray reads it and once Ray has written it."""
    token = Path.home() / ".ray" / "auth_token"
    for path, mode in ((token.parent, 0o700), (token, 0o600)):
        try:
            if path.stat().st_mode & 0o777 != mode:
                path.chmod(mode)
        except FileNotFoundError:
            continue
        except OSError as error:  # not ours to change: say so, start anyway
            log.warning("cannot make %s private: %s", path, error)


# A local Ray is one node: the GCS marking it dead for missed health checks never helps (no
# other node takes its tasks) and ends the job. Ray's default, 5 missed checks 3 s apart,
# killed the raylet of a nightly job while the host was loaded (a CI run, 2026-11-29): it
# is allowed a minute.
LOCAL_SYSTEM_CONFIG = {"health_check_failure_threshold": 20, "health_check_period_ms": 3000}

# A local start tried this many times in all. Ray gives its raylet a fixed 30 s to register
# with the GCS (ray/_private/node.py); on a loaded host (a shared CI runner, a laptop
# compiling) it can miss that once and register at once on a second try.
LOCAL_START_ATTEMPTS = 3


def _start_failure(error: Exception) -> bool:
    """A start worth trying again: Ray's own start failures, not a bad argument of ours."""
    return not isinstance(error, (TypeError, ValueError))


def _start_local(num_cpus: int | None) -> None:
    """A Ray of the job's own, started again when it does not come up, after what the
    failed start left running is stopped."""
    import ray
    import stamina

    for attempt in stamina.retry_context(
        on=_start_failure, attempts=LOCAL_START_ATTEMPTS, wait_initial=1.0, wait_max=10.0
    ):
        with attempt:
            before = set(_children())
            try:
                # "local": with no address at all, ray.init joins the newest cluster a
                # `ray start` left on this machine (/tmp/ray/ray_current_cluster)
                ray.init(
                    address="local",
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                    _system_config=LOCAL_SYSTEM_CONFIG,
                )
            except Exception:
                ray.shutdown()
                _stop_left_behind(before, os.path.dirname(ray.__file__))
                raise


def _children() -> list[int]:
    """This process's children, from /proc (a scan: /proc/PID/task/*/children needs a
    kernel built with CONFIG_PROC_CHILDREN)."""
    me = os.getpid()
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # after the command's closing parenthesis: state, then the parent's pid
                fields = stat.read().rpartition(b")")[2].split()
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            continue
        if int(fields[1]) == me:
            pids.append(int(entry))
    return pids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _stop_left_behind(before: set[int], ray_home: str, grace_s: float = 5.0) -> list[int]:
    """Stop (and reap) the children a failed ray.init started from Ray's package: when its
    node never came up, ray.shutdown does not know them (its GCS, raylet, monitors and
    dashboard would run on beside the next start). Returns their pids."""
    started = [p for p in _children() if p not in before and ray_home in _cmdline(p)]
    for pid in started:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    running = list(started)
    while running and time.monotonic() < deadline:
        running = [pid for pid in running if not _reaped(pid)]
        if running:
            time.sleep(0.05)
    for pid in running:
        _signal(pid, signal.SIGKILL)
        _reaped(pid, block=True)
    return started


def _signal(pid: int, signum: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signum)


def _reaped(pid: int, *, block: bool = False) -> bool:
    try:
        done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:  # already reaped (by Ray's own Popen)
        return True
    return done == pid


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


def pool_map(
    function: Callable[[T], R],
    items: Sequence[T],
    *,
    on_done: Callable[[int, int], None] | None = None,
    **_options: Any,
) -> list[R]:
    """ray_map's contract on a pool of this host's processes, for where Ray cannot start (a
    loaded host) or is not wanted: results in the items' order, the first exception raised
    after every task has ended. Ray's task options (num_cpus …) mean nothing here."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    import cloudpickle

    # by value, as Ray sends a task: the evaluation's tasks are closures, which the pool's
    # own pickle refuses
    shipped = cloudpickle.dumps(function)
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {
            pool.submit(_call_shipped, shipped, item): index for index, item in enumerate(items)
        }
        results: dict[int, R] = {}
        failed: BaseException | None = None
        for done, future in enumerate(as_completed(futures), start=1):
            try:
                results[futures[future]] = future.result()
            except Exception as error:
                failed = failed or error
            if on_done is not None:
                on_done(done, len(items))
    if failed is not None:
        raise failed
    return [results[index] for index in range(len(items))]


def _call_shipped(shipped: bytes, item: Any) -> Any:
    import cloudpickle

    return cloudpickle.loads(shipped)(item)


@contextmanager
def mapper_session(
    use_ray: bool = True,
) -> Iterator[tuple[str, Callable[..., list[Any]]]]:
    """Where tasks run and the map that runs them: Ray (the cluster RAY_ADDRESS names, or a
    local one) when asked for and it starts, else a pool of this host's processes — said in
    the first value, so a record says which."""
    with ExitStack() as stack:
        if use_ray:
            try:
                where = stack.enter_context(ray_session())
            except Exception as error:
                reason = f"Ray could not start ({type(error).__name__}: {str(error)[:120]})"
            else:
                yield where, ray_map
                return
        else:
            reason = "Ray not asked for"
        yield f"a pool of {os.cpu_count()} processes on this host; {reason}", pool_map
