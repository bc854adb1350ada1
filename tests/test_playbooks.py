"""Every playbook parses (roles, variables, module names) with the real ansible-playbook, and
the inventory plugin's documentation is valid. The playbooks' behaviour is tested where it can
run here: tests/test_rollouts.py (rollout.yml, rollback.yml, the plugin),
tests/agent/test_agent_role.py (agent.yml) and tests/test_service_role.py (service.yml).
fios.yml needs a Debian 6.1 kernel with its headers; this machine's kernel is not one:
tests/kernel/test_fios_dkms.py builds it for the lab's kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PLAYBOOKS = Path(__file__).resolve().parents[1] / "playbooks"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}


@pytest.mark.parametrize(
    "playbook", ["agent.yml", "fios.yml", "rollout.yml", "rollback.yml", "service.yml"]
)
def test_playbook_syntax(playbook: str) -> None:
    checked = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "--syntax-check", playbook],
        cwd=PLAYBOOKS,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "WARNING" not in checked.stderr, checked.stderr


def test_without_an_inventory_nothing_is_targeted_and_a_bad_one_is_an_error() -> None:
    """Issue 67: the shipped ansible.cfg made every command without -i fail; it now reads an
    inventory with no hosts, and an inventory named that cannot be read is still an error."""

    def playbook(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "ansible-playbook"), *extra, "agent.yml"],
            cwd=PLAYBOOKS, env=ENV, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip

    assert playbook("--syntax-check").returncode == 0
    listed = playbook("--list-hosts")
    assert listed.returncode == 0, listed.stderr
    assert "hosts (0)" in listed.stdout, listed.stdout
    unreadable = playbook("-i", "/nonexistent/inventory.yml", "--list-hosts")
    assert unreadable.returncode != 0
    assert "No inventory was parsed" in unreadable.stderr, unreadable.stderr


def test_inventory_plugin_documents_itself() -> None:
    doc = subprocess.run(
        [str(BIN / "ansible-doc"), "-t", "inventory", "--json", "blkpilot"],
        cwd=PLAYBOOKS,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert doc.returncode == 0, doc.stderr
    assert '"url"' in doc.stdout
    assert '"keyed_groups"' in doc.stdout  # the constructed features come with it


def test_the_policy_role_refuses_to_run_without_a_rollout(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-e",
            f"blkpilot_state_dir={tmp_path}",
            "rollout.yml",
        ],
        cwd=PLAYBOOKS,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode != 0
    assert "rollout_id, rollout_config and blkpilot_devices must be set" in run.stdout
    assert list(tmp_path.iterdir()) == []  # nothing was written
