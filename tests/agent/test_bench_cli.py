"""`blkpilot bench …` as an operator runs it, reporting to a real service."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.agent.conftest import LoopFactory, enroll_lab_node
from tests.proc import BLKPILOT, ServiceProcess, clean_env


def test_sweep_sends_every_result_as_an_observation(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    device = loop_device()
    state_dir = tmp_path / "agent"
    enroll_lab_node(service, state_dir, [device])

    sweep = [
        BLKPILOT,
        "bench",
        "sweep",
        "--state-dir",
        str(state_dir),
        "--device",
        device,
        "--workload",
        "hs23-single-randread-4k-qd1",
        "--workload",
        "fios-1r1w",
        "--scheduler",
        "none",
        "--scheduler",
        "kyber",
        "--duration",
        "0.3",
    ]
    first = subprocess.run(
        sweep, env=clean_env(tmp_path), capture_output=True, text=True, timeout=300, check=False
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 measured now, 4 in all" in first.stdout
    observations = service.api("GET", "/observations", params={"kind": "benchmark"}).json()
    cells = sorted((o["workload"]["name"], o["configuration"]["scheduler"]) for o in observations)
    assert cells == [
        ("fios-1r1w", "kyber"),
        ("fios-1r1w", "none"),
        ("hs23-single-randread-4k-qd1", "kyber"),
        ("hs23-single-randread-4k-qd1", "none"),
    ]
    fairness = next(o for o in observations if o["workload"]["name"] == "fios-1r1w")["metrics"]
    assert {"worst_slowdown", "concurrent_efficiency", "proportional_slowdown"} <= set(fairness)
    assert "[none]" in Path(f"/sys/block/{device}/queue/scheduler").read_text()

    again = subprocess.run(
        sweep, env=clean_env(tmp_path), capture_output=True, text=True, timeout=300, check=False
    )
    assert (
        "0 measured now, 4 in all" in again.stdout
    )  # done is done: nothing measured or sent twice
    assert len(service.api("GET", "/observations", params={"kind": "benchmark"}).json()) == 4


def test_write_sweep_on_a_data_device_is_refused(loop_device: LoopFactory, tmp_path: Path) -> None:
    device = loop_device(on="disk")
    subprocess.run(["mkfs.ext4", "-q", "-F", f"/dev/{device}"], check=True)
    result = subprocess.run(
        [
            BLKPILOT,
            "bench",
            "sweep",
            "--state-dir",
            str(tmp_path / "agent"),
            "--device",
            device,
            "--workload",
            "hs23-single-randwrite-4k-qd1",
            "--no-report",
        ],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "holds data" in result.stderr
    assert "filesystem signature ext4" in result.stderr
