"""`blkpilot demo` (what `make demo` runs): the service on the embedded database within 60 s,
three lab loop devices (one holding a filesystem with data) with the local agent reporting
on them, and a clean stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proc import BLKPILOT, clean_env, free_port, stop

pytestmark = pytest.mark.slow


def _run_demo(
    data_dir: Path, port: int, agent_port: int
) -> tuple[subprocess.Popen[str], list[str], float]:
    process = subprocess.Popen(
        [
            BLKPILOT,
            "demo",
            "--port",
            str(port),
            "--agent-metrics-port",
            str(agent_port),
            "--agent-interval",
            "0.5",
            "--tune-seconds",
            "0",
        ],
        env=clean_env(data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = time.monotonic()
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip())
        if line.strip() == "blkpilot demo ready":
            return process, lines, time.monotonic() - started
    process.wait()
    raise AssertionError("demo exited before it was ready:\n" + "\n".join(lines[-40:]))


def _get(base: str, token: str, path: str) -> Any:
    return httpx.get(f"{base}/api/v1{path}", headers={"Authorization": f"Bearer {token}"}).json()


def test_demo_runs_the_loop_on_lab_devices_and_stops_cleanly(tmp_path: Path) -> None:
    port, agent_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    process, lines, seconds = _run_demo(tmp_path, port, agent_port)
    try:
        assert seconds < 60, f"demo took {seconds:.1f} s"
        assert f"  API            {base}/api/v1" in lines
        # the service's own log lines (the database's start, each migration) go to its log
        # file, not before the banner (issue 67: ~170 JSON lines did)
        logged = [line for line in lines if line.startswith("{")]
        assert not logged, logged[:5]
        assert "alembic" in (tmp_path / "service.log").read_text()
        assert httpx.get(f"{base}/readyz").json()["status"] == "ok"
        token = (tmp_path / "admin.token").read_text().strip()
        assert (tmp_path / "admin.token").stat().st_mode & 0o777 == 0o600
        nodes = _get(base, token, "/nodes")
        assert len(nodes) == 1
        assert nodes[0]["labels"] == {"demo": "true", "role": "lab"}

        # the three lab devices, reported by the local agent, and their telemetry arriving:
        # two empty scratch devices, and one holding ext4 with its own traffic, whose windows
        # carry latency distributions from eBPF
        deadline = time.monotonic() + 30
        devices: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            devices = _get(base, token, "/devices")
            if len(devices) == 3 and all(
                _get(base, token, f"/devices/{d['id']}/telemetry") for d in devices
            ):
                break
            time.sleep(0.5)
        assert sorted(d["transport"] for d in devices) == ["loop", "loop", "loop"]
        assert sorted(d["holds_data"] for d in devices) == [False, False, True]
        (holding,) = [d for d in devices if d["holds_data"]]
        windows = _get(base, token, f"/devices/{holding['id']}/telemetry")
        busy = [w for w in windows if w["read_ios"] > 0]
        assert busy, windows
        assert all(w["latency_source"] == "ebpf" for w in busy), busy[0]["latency_note"]
        assert all(w["p99_us"] is not None and w["p99_us"] > 0 for w in busy)
        lab = [d["name"] for d in devices]
        metrics = httpx.get(f"http://127.0.0.1:{agent_port}/metrics").text
        assert all(f'device="{name}"' in metrics for name in lab)
        # the access log: a JSON line per request, with its time and id (issue 67)
        entries = [json.loads(line) for line in (tmp_path / "access.log").read_text().splitlines()]
        ready = next(e for e in entries if e["message"].startswith("GET /readyz"))
        assert ready["time"], ready
        assert ready["request_id"], ready
        assert ready["status"] == 200, ready
    finally:
        code = stop(process, signal.SIGINT)
    assert code == 0
    assert not (tmp_path / "postgres" / "postmaster.pid").exists()
    # the lab devices are detached and their files gone
    assert not (tmp_path / "lab" / "disk.img").exists()
    assert not (tmp_path / "lab" / "data.img").exists()
    assert not os.path.ismount(tmp_path / "lab" / "mnt")
    assert not Path(f"/dev/shm/blkpilot-demo-{port}.img").exists()
    for name in lab:
        assert Path(f"/sys/block/{name}/size").read_text().strip() == "0"

    # A second run on the same data reuses the database and the node, and revokes the old token.
    process, lines, _ = _run_demo(tmp_path, port, agent_port)
    try:
        assert any("already enrolled" in line for line in lines)
        old = httpx.get(f"{base}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"})
        assert old.status_code == 401
        fresh = (tmp_path / "admin.token").read_text().strip()
        assert len(_get(base, fresh, "/nodes")) == 1
    finally:
        assert stop(process, signal.SIGINT) == 0


def test_a_step_that_hangs_is_stopped_at_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A demo step that never ends (the nightly job on a Ray that stopped answering) is
    stopped once its budget has passed, so the demo goes on to its in-process fallback."""
    import sys

    from service import demo

    monkeypatch.setitem(demo.STEP_BUDGET_S, "-c", 1.0)
    running: list[subprocess.Popen[bytes]] = []
    began = time.monotonic()
    code = demo._step(
        [sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "log", running
    )
    assert code == demo.STEP_TIMED_OUT
    assert time.monotonic() - began < 60
    assert running == []
    assert "stopped after 1 s" in (tmp_path / "log").read_text()
    # a step that ends in time gives its own exit status
    assert demo._step([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log", []) == 3
