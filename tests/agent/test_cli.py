"""`blkpilot agent …` as an operator runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import LoopFactory
from tests.proc import BLKPILOT, clean_env

ROOT = Path(__file__).resolve().parents[2]


def agent(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BLKPILOT, "agent", *args],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_discover_json_on_fixture_hardware(fixture_host: Path, tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'sys_root = "{fixture_host / "sys"}"\nproc_root = "{fixture_host / "proc"}"\n'
        f'dev_root = "{fixture_host / "dev"}"\n'
    )
    result = agent("discover", "--json", "--config", str(config), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    classes = {d["name"]: d["device_class"] for d in found["devices"]}
    assert classes == {"nvme0n1": "nvme_flash", "nvme1n1": "ull", "sda": "hdd"}
    assert found["kernel"] == "6.1.0-18-amd64"
    assert "zram0" in found["skipped"]


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("interval_s = -1\nsurprise = true\n")
    result = agent("discover", "--config", str(config), tmp_path=tmp_path)
    assert result.returncode == 2
    assert "interval_s" in result.stderr
    assert "surprise" in result.stderr


def test_apply_status_rollback(loop_device: LoopFactory, tmp_path: Path) -> None:
    device = loop_device()
    state = ["--state-dir", str(tmp_path / "agent")]
    applied = agent(
        "apply", device, *state, "--scheduler", "kyber", "--read-ahead-kb", "64", tmp_path=tmp_path
    )
    assert applied.returncode == 0, applied.stderr
    assert f"undo with: blkpilot agent rollback {device}" in applied.stdout
    status = agent("status", *state, tmp_path=tmp_path)
    assert f"{device}: " in status.stdout
    assert "holds" in status.stdout
    refused = agent(
        "apply",
        device,
        *state,
        "--scheduler",
        "bfq",
        "--tunable",
        "low_latency=5",
        tmp_path=tmp_path,
    )
    assert refused.returncode == 2
    assert "low_latency=5 is outside the allowed range [0, 1]" in refused.stderr
    kernel_says_no = agent(
        "apply", device, *state, "--completion", "classic_poll", tmp_path=tmp_path
    )
    assert kernel_says_no.returncode == 1
    assert "EINVAL" in kernel_says_no.stderr
    assert "[kyber]" in Path(f"/sys/block/{device}/queue/scheduler").read_text()
    rolled = agent("rollback", device, *state, tmp_path=tmp_path)
    assert rolled.returncode == 0, rolled.stderr
    assert "[none]" in Path(f"/sys/block/{device}/queue/scheduler").read_text()


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze comes with Debian's systemd package"
    import jinja2

    role = ROOT / "playbooks" / "roles" / "blkpilot_agent"
    template = (role / "templates" / "blkpilot-agent.service.j2").read_text()
    defaults = {"blkpilot_state_dir": "/var/lib/blkpilot/agent", "blkpilot_config_dir": "/etc/x"}
    # verify needs the ExecStart binary to exist: point it at this checkout's
    unit = jinja2.Template(template, undefined=jinja2.StrictUndefined).render(
        blkpilot_cli=BLKPILOT, **defaults
    )
    assert f"ExecStart={BLKPILOT} agent run --state-dir /var/lib/blkpilot/agent" in unit
    local = tmp_path / "blkpilot-agent.service"
    local.write_text(unit)
    result = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("command", ["discover", "run", "apply", "rollback", "status"])
def test_help(command: str, tmp_path: Path) -> None:
    result = agent(command, "--help", tmp_path=tmp_path)
    assert result.returncode == 0
    assert "Usage" in result.stdout


def test_help_reflows_docstrings_to_the_terminal(tmp_path: Path) -> None:
    """A docstring's own line breaks do not reach the help (they read as ragged lines at any
    width); its lists still do."""
    env = {**clean_env(tmp_path), "COLUMNS": "200"}
    for args, phrase in (
        (["--help"], "three lab loop devices (two scratch, one holding ext4"),
        (["agent", "canary", "--help"], "4 could not run (no eBPF, too little traffic"),
    ):
        shown = subprocess.run(
            [BLKPILOT, *args], env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout
        assert phrase in shown, shown


def test_a_canary_budget_below_its_first_look_is_refused(
    loop_device: LoopFactory, tmp_path: Path
) -> None:
    """Before anything is applied: the device keeps its scheduler."""
    name = loop_device(size_mb=16)
    before = Path(f"/sys/block/{name}/queue/scheduler").read_text()
    for args, option in (
        (["--mode", "live", "--pairs", "10", "--max-pairs", "5"], "--max-pairs"),
        (["--mode", "synthetic", "--rounds", "8", "--max-rounds", "4"], "--max-rounds"),
    ):
        result = agent(
            "canary", name, "--scheduler", "bfq", "--no-report", *args, tmp_path=tmp_path
        )
        assert result.returncode == 2, result.stderr
        assert option in result.stderr
        assert Path(f"/sys/block/{name}/queue/scheduler").read_text() == before


@pytest.mark.parametrize("content", ["", "{}", '{"server_url": "http://127.0.0.1:1", "node_i'])
def test_an_unreadable_node_state_is_one_line_and_a_status_systemd_does_not_restart(
    fixture_host: Path, tmp_path: Path, content: str
) -> None:
    """Issue 64: a truncated, empty or emptied node.json crash-looped the agent with a
    46-line traceback. Now: one line naming the file and what to do, exit 78 (EX_CONFIG),
    which the unit lists in RestartPreventExitStatus; `agent status` says the same line."""
    config = tmp_path / "agent.toml"
    config.write_text(
        f'sys_root = "{fixture_host / "sys"}"\nproc_root = "{fixture_host / "proc"}"\n'
        f'dev_root = "{fixture_host / "dev"}"\nmetrics_port = 0\n'
    )
    state = tmp_path / "state"
    state.mkdir()
    (state / "node.json").write_text(content)
    run = agent("run", "--state-dir", str(state), "--config", str(config), tmp_path=tmp_path)
    assert run.returncode == 78, run.stderr
    assert "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert str(state / "node.json") in line
    assert "re-enrol" in line
    status = agent("status", "--state-dir", str(state), "--config", str(config), tmp_path=tmp_path)
    assert "Traceback" not in status.stderr
    assert "unreadable" in status.stdout
    unit = (ROOT / "playbooks/roles/blkpilot_agent/templates/blkpilot-agent.service.j2").read_text()
    assert "RestartPreventExitStatus=78" in unit


def test_a_metrics_port_in_use_is_said_not_a_traceback(fixture_host: Path, tmp_path: Path) -> None:
    import socket

    config = tmp_path / "agent.toml"
    config.write_text(
        f'sys_root = "{fixture_host / "sys"}"\nproc_root = "{fixture_host / "proc"}"\n'
        f'dev_root = "{fixture_host / "dev"}"\n'
    )
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        run = agent(
            "run",
            "--offline",
            "--state-dir",
            str(tmp_path / "state"),
            "--config",
            str(config),
            "--metrics-port",
            str(port),
            tmp_path=tmp_path,
        )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in run.stderr
