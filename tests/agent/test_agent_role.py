"""The blkpilot_agent role, run by the real ansible-playbook against this machine (local
connection) into a scratch prefix: a virtualenv with only the agent extra, agent.toml, a unit
that systemd-analyze accepts, and the node enrolled with a real service."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proc import ServiceProcess, assert_unit_verifies, run_playbook

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_agent_role_installs_configures_and_enrolls(
    service: ServiceProcess, tmp_path: Path
) -> None:
    prefix, state, etc, units = (tmp_path / d for d in ("opt", "state", "etc", "units"))
    variables = {
        "blkpilot_agent_prefix": str(prefix),
        "blkpilot_agent_package": f"{ROOT}[agent]",
        "blkpilot_install_os_packages": False,
        "blkpilot_state_dir": str(state),
        "blkpilot_config_dir": str(etc),
        "blkpilot_systemd_dir": str(units),
        "blkpilot_agent_service": False,  # no systemd as PID 1 here
        "blkpilot_server_url": service.base_url,
        "blkpilot_api_token": service.admin,  # asks for this node's one-time token
        "blkpilot_node_labels": {"rack": "r7", "role": "db"},
        "blkpilot_agent_devices": ["nvme0n1", "nvme1n1"],
        "blkpilot_python": shutil.which("python3") or "python3",
    }
    units.mkdir()
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    inventory = "node-role-test,"
    run = run_playbook(
        "-i",
        inventory,
        "-c",
        "local",
        "-e",
        f"@{tmp_path / 'vars.json'}",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "agent.yml",
        tmp_path=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert service.admin not in run.stdout + run.stderr  # no_log on the tokens

    cli = prefix / "bin" / "blkpilot"
    installed = subprocess.run(
        [
            str(prefix / "bin" / "python"),
            "-c",
            "import importlib.util as u; print(u.find_spec('fastapi'),"
            " u.find_spec('httpx') is not None)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert installed.stdout.split() == ["None", "True"]  # the agent extra, not the server
    assert (
        subprocess.run([str(cli), "agent", "--help"], capture_output=True, check=False).returncode
        == 0
    )
    config = (etc / "agent.toml").read_text()
    assert 'devices = ["nvme0n1", "nvme1n1"]' in config
    unit = (units / "blkpilot-agent.service").read_text()
    assert f"ExecStart={cli} agent run --state-dir {state} --config {etc}/agent.toml" in unit
    assert_unit_verifies(units / "blkpilot-agent.service")

    node = json.loads((state / "node.json").read_text())
    (listed,) = service.api("GET", "/nodes", params={"hostname": "node-role-test"}).json()
    assert listed["id"] == node["node_id"]
    assert listed["labels"] == {"rack": "r7", "role": "db"}

    again = run_playbook(
        "-i",
        inventory,
        "-c",
        "local",
        "-e",
        f"@{tmp_path / 'vars.json'}",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "agent.yml",
        tmp_path=tmp_path,
    )
    assert again.returncode == 0, again.stdout[-3000:]
    # idempotent: enrolled once, nothing rewritten; pip reinstalls a source directory (a
    # version from an index would not change either)
    task, changed = "", []
    for line in again.stdout.splitlines():
        task = line if line.startswith("TASK [") else task
        if line.startswith("changed:"):
            changed.append(task)
    assert len(changed) == 1, again.stdout
    assert "blkpilot with the agent extra only" in changed[0]
