"""`blkpilot demo` (what `make demo` runs) answers on the embedded database within 60 s."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.proc import BLKPILOT, clean_env, free_port, stop

pytestmark = pytest.mark.slow


def _run_demo(data_dir: Path, port: int) -> tuple[subprocess.Popen[str], list[str], float]:
    process = subprocess.Popen(
        [BLKPILOT, "demo", "--port", str(port)],
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


def test_demo_serves_enrolls_the_local_node_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    process, lines, seconds = _run_demo(tmp_path, port)
    try:
        assert seconds < 60, f"demo took {seconds:.1f} s"
        base = f"http://127.0.0.1:{port}"
        assert f"  API            {base}/api/v1" in lines
        assert httpx.get(f"{base}/readyz").json()["status"] == "ok"
        token = (tmp_path / "admin.token").read_text().strip()
        assert (tmp_path / "admin.token").stat().st_mode & 0o777 == 0o600
        nodes = httpx.get(
            f"{base}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}
        ).json()
        assert len(nodes) == 1
        assert nodes[0]["labels"] == {"demo": "true", "role": "lab"}
    finally:
        code = stop(process, signal.SIGINT)
    assert code == 0
    assert not (tmp_path / "postgres" / "postmaster.pid").exists()

    # A second run on the same data reuses the database and the node, and revokes the old token.
    process, lines, _ = _run_demo(tmp_path, port)
    try:
        assert any("already enrolled" in line for line in lines)
        base = f"http://127.0.0.1:{port}"
        assert (
            httpx.get(
                f"{base}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}
            ).status_code
            == 401
        )
        fresh = (tmp_path / "admin.token").read_text().strip()
        nodes = httpx.get(
            f"{base}/api/v1/nodes", headers={"Authorization": f"Bearer {fresh}"}
        ).json()
        assert len(nodes) == 1
    finally:
        assert stop(process, signal.SIGINT) == 0
