"""The learning loop closed on a real node: benchmarks on a loop device become observations,
`blkpilot nightly` (local Ray) schedules a canary for the configuration most worth measuring,
`blkpilot agent canaries --run` runs it on the device, records the verdict and closes it —
and the device is back in its configuration."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import LoopFactory, enroll_lab_node
from tests.proc import BLKPILOT, ServiceProcess, clean_env
from tests.proc import run as run_cli

WORKLOADS = [
    "hs23-single-randread-4k-qd1",
    "hs23-single-randread-4k-qd16",
    "hs23-single-randwrite-4k-qd1",
    "hs23-single-randrw50-4k-qd1",
]


@pytest.mark.timeout(600)
def test_nightly_schedules_and_the_agent_runs_a_canary(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    device = loop_device(on="tmpfs")
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir, [device])
    env = clean_env(tmp_path)
    sweep = [
        BLKPILOT,
        "bench",
        "sweep",
        "--state-dir",
        str(state_dir),
        "--device",
        device,
        "--scheduler",
        "none",
        "--duration",
        "0.3",
    ]
    for name in WORKLOADS:
        sweep += ["--workload", name]
    done = subprocess.run(sweep, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

    # only `none` was measured: every other candidate is untried, so a canary is worth it
    nightly = run_cli(
        "nightly",
        "--json",
        "--objective",
        "p50_latency",
        "--max-canaries",
        "1",
        env=service.env,
        timeout=600,
    )
    assert nightly.returncode == 0, nightly.stderr[-3000:]
    report = json.loads(nightly.stdout)
    (scheduled,) = report["canaries"]
    assert scheduled["device"] == device
    assert scheduled["config"] != "none[]/interrupt"

    listed = subprocess.run(
        [BLKPILOT, "agent", "canaries", "--state-dir", str(state_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert f"#1 {device}" in listed.stdout

    ran = subprocess.run(
        [
            BLKPILOT,
            "agent",
            "canaries",
            "--state-dir",
            str(state_dir),
            "--run",
            "--rounds",
            "3",
            "--max-rounds",
            "6",
            "--round-seconds",
            "0.3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "result recorded" in ran.stdout
    # whatever the verdict, the device is as it was: the operator decides
    assert "[none]" in Path(f"/sys/block/{device}/queue/scheduler").read_text()

    (observation,) = service.api("GET", "/observations", params={"kind": "canary"}).json()
    assert observation["verdict"] in ("pass", "fail", "inconclusive")
    stats = observation["statistics"]
    assert stats["budget_rounds"] == 6
    assert stats["planned_looks"] == 2
    # inconclusive after 3 rounds: 3 more, then the verdict stands
    assert stats["rounds"] == (6 if stats["looks"] == 2 else 3), stats
    assert stats["looks"] == 2 or observation["verdict"] != "inconclusive"
    # the baseline arm measured `none` as well: a benchmark of it, with the canary's medians
    benchmarks = service.api("GET", "/observations", params={"kind": "benchmark"}).json()
    assert len(benchmarks) == len(WORKLOADS) + 1
    (baseline,) = [
        b
        for b in benchmarks
        if b["workload"]["name"] == observation["workload"]["name"]
        and b["finished_at"] >= observation["finished_at"]
    ]
    assert baseline["configuration"]["scheduler"] == "none"
    assert baseline["metrics"]
    for metric, value in baseline["metrics"].items():
        assert value == pytest.approx(observation["statistics"][f"{metric}.baseline_median"])
    assert service.api("GET", f"/nodes/{node.node_id}/canaries").json() == []
    (closed,) = service.api("GET", "/canaries", params={"status": "done"}).json()
    again = service.api(
        "POST", f"/canaries/{closed['id']}/done", json={"observation_id": observation["id"]}
    )
    assert again.status_code == 409
    audit = service.api("GET", "/audit", params={"action": "canary.done"}).json()
    assert len(audit) == 1
