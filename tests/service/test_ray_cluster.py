"""The nightly job on a real multi-process Ray cluster on this machine: `ray start --head` and
a second `ray start --address …` as separate processes (two nodes, one CPU each), and the job —
`blkpilot nightly`, a process of its own — connecting through RAY_ADDRESS, as a
user who outgrew one machine would point blkpilot at their cluster with nothing else changed.
Its training data are recorded runs of the policy grid (real fio on this machine's loop
devices), stored as observations in a database of the test's own."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from agent.contract.wire import ObservationCreate, ObservationKind
from models.grid import Grid
from service import db
from service.observations import service as observations
from service.security import Principal
from tests.conftest import create_database, drop_database
from tests.factories import create_node, device_inventory, report_inventory
from tests.proc import BLKPILOT, free_port

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "ray")
GRID = ROOT / "bench" / "results" / "policy_grid_runs.json.gz"
DEVICES = ("host-loop-tmpfs", "host-loop-disk")


def _ray(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RAY, *args], env=env, capture_output=True, text=True, timeout=180, check=False
    )


@pytest.fixture
def ray_auth(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Ray's token authentication, as a cluster reachable from other machines should run: one
    secret for every process of the cluster and for the job that connects to it."""
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    for name, value in auth.items():
        monkeypatch.setenv(name, value)
    return auth


@pytest.fixture
def ray_cluster(ray_auth: dict[str, str]) -> Iterator[str]:
    # Ray's sockets live under its temp dir: a short path (a Unix socket's is at most 107 bytes)
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    port = free_port()
    env = {**os.environ, **ray_auth, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    head = _ray(
        "start",
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        env=env,
    )
    address = f"127.0.0.1:{port}"
    try:
        assert head.returncode == 0, head.stderr[-2000:]
        worker = _ray(
            "start", f"--address={address}", "--node-ip-address=127.0.0.1", "--num-cpus=1", env=env
        )
        assert worker.returncode == 0, worker.stderr[-2000:]
        yield address
    finally:
        # this cluster's processes only: `ray stop` kills every Ray on the machine — the local
        # Ray a nightly test runs on the other worker (its driver, a pytest worker, then dies)
        _stop_cluster(temp)
        shutil.rmtree(temp, ignore_errors=True)


def _stop_cluster(temp: Path, grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after grace_s, to the processes whose command line names this
    cluster's temp dir (its GCS, raylets, monitors and workers: their log and session
    directories are under it)."""

    def ours() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if str(temp).encode() in cmdline:
                found.append(int(entry))
        return found

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while ours() and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture
def scratch_url(server_url: str) -> Iterator[str]:
    url = create_database(server_url, "blkpilot_test_ray_cluster")
    db.upgrade(url)
    yield url
    drop_database(server_url, "blkpilot_test_ray_cluster")


def _observations(url: str) -> int:
    """The recorded grid's runs of the host's two loop devices on three workloads."""
    grid = Grid.load(GRID)
    engine = db.create_db_engine(url, pool_size=1)
    stored = 0
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            node, _ = create_node(session)
            principal = Principal(name=f"node:{node.hostname}", node_id=node.id)
            names = {"host-loop-tmpfs": "loop0", "host-loop-disk": "loop1"}
            made = report_inventory(session, node, *(device_inventory(n) for n in names.values()))
            ids = {grid_name: d.id for grid_name, d in zip(names, made, strict=True)}
            workloads = sorted({r.workload for r in grid.runs if r.device in DEVICES})[:3]
            finished = datetime.now(UTC) - timedelta(hours=1)
            for run in grid.runs:
                if run.device not in DEVICES or run.workload not in workloads:
                    continue
                observations.record(
                    session,
                    principal,
                    ObservationCreate(
                        device_id=ids[run.device],
                        kind=ObservationKind.BENCHMARK,
                        tool="fio",
                        workload=grid.workloads[run.workload],
                        configuration=run.config,
                        metrics=run.metrics,
                        started_at=finished - timedelta(seconds=2),
                        finished_at=finished,
                    ),
                )
                stored += 1
    finally:
        engine.dispose()
    return stored


@pytest.mark.timeout(900)
def test_nightly_on_a_two_node_ray_cluster(
    ray_cluster: str, ray_auth: dict[str, str], scratch_url: str
) -> None:
    stored = _observations(scratch_url)
    assert stored > 100
    env = {
        **os.environ,
        **ray_auth,
        "RAY_ADDRESS": ray_cluster,
        "RAY_USAGE_STATS_ENABLED": "0",
        "BLKPILOT_DATABASE_URL": scratch_url,
    }

    # the cluster is two processes' nodes, each with its own CPU
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ray; ray.init(log_to_driver=False);"
            " print(sum(n['Alive'] for n in ray.nodes()), ray.cluster_resources()['CPU'])",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split()[-2:] == ["2", "2.0"]

    job = subprocess.run(
        [BLKPILOT, "nightly", "--max-canaries", "0", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    report = json.loads(job.stdout[job.stdout.index("{") :])
    assert report["where"] == f"the Ray cluster at {ray_cluster}"
    assert report["samples"] == stored
    assert {"p50_latency", "p99_latency", "iops"} <= {m["objective"] for m in report["models"]}
    # stdout is the report alone; stderr says how the job moved, task by task
    trained = len(report["models"])
    assert f"models trained: {trained} of {trained} (the Ray cluster at {ray_cluster})" in (
        job.stderr
    ), job.stderr[-3000:]
