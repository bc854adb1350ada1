"""A fleet node installs only the agent extra: no FastAPI, SQLAlchemy, scikit-learn or Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER_ONLY = [
    "fastapi",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "pgserver",
    "sklearn",
    "ray",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv")
    assert uv is not None, "uv is installed by `make test`; run the tests through it"
    venv = tmp_path_factory.mktemp("node") / "venv"
    result = subprocess.run(
        [
            uv,
            "sync",
            "--frozen",
            "--no-dev",
            "--extra",
            "agent",
            "--no-editable",
            "--project",
            str(ROOT),
        ],
        env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return venv


def _run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A command of the node's install, away from the checkout (whose packages a `python -c`
    run inside it would import instead)."""
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_agent_help_works(agent_venv: Path) -> None:
    result = _run(agent_venv, "blkpilot", "agent", "--help")
    assert result.returncode == 0, result.stderr
    assert "enroll" in result.stdout
    assert "heartbeat" in result.stdout


def test_server_stack_is_not_installed(agent_venv: Path) -> None:
    probe = "import importlib.util as u, sys; print(*[m for m in sys.argv[1:] if u.find_spec(m)])"
    result = _run(agent_venv, "python", "-c", probe, *SERVER_ONLY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_server_commands_explain_the_missing_extra(agent_venv: Path) -> None:
    result = _run(agent_venv, "blkpilot", "serve")
    assert result.returncode == 2
    assert "blkpilot[server]" in result.stderr


def test_every_command_has_help(agent_venv: Path) -> None:
    for command in (
        ["--help"],
        ["agent", "enroll", "--help"],
        ["db", "--help"],
        ["token", "create", "--help"],
    ):
        result = _run(agent_venv, "blkpilot", *command)
        assert result.returncode == 0, (command, result.stderr)


def test_wheel_ships_the_migrations(agent_venv: Path) -> None:
    site = next((agent_venv / "lib").glob("python3*/site-packages"))
    assert (site / "migrations" / "env.py").is_file()
    assert list((site / "migrations" / "versions").glob("0001_*.py"))


def test_the_wheel_carries_the_ebpf_object(agent_venv: Path) -> None:
    """Git ignores the compiled object; the build hook puts it in the wheel (a node installed
    from it had no live canary: "…/blklat.bpf.o is missing")."""
    site = next((agent_venv / "lib").glob("python3*/site-packages"))
    built = site / "agent" / "ebpf" / "blklat.bpf.o"
    assert built.is_file()
    assert built.read_bytes()[:4] == b"\x7fELF"


def test_a_node_install_traces_and_runs_a_live_canary(agent_venv: Path, tmp_path: Path) -> None:
    """From the node's virtualenv: the collector loads the wheel's object, `agent status` says
    eBPF is available, and a live canary reaches a verdict on a device that holds data."""
    from kernel.lab.devices import TMPFS, data_device, start_workload, stop_workload

    probe = (
        "from agent.collectors.blklat import BlkLatCollector, DEFAULT_OBJECT;"
        "from agent.host import HostPaths;"
        "c = BlkLatCollector(HostPaths()); print(c.available, DEFAULT_OBJECT, c.unavailable)"
    )
    loaded = _run(agent_venv, "python", "-c", probe)
    assert loaded.stdout.startswith("True "), loaded.stdout + loaded.stderr
    assert str(agent_venv) in loaded.stdout  # the installed object, not the checkout's
    state = tmp_path / "agent"
    status = _run(agent_venv, "blkpilot", "agent", "status", "--state-dir", str(state))
    assert "eBPF: available" in status.stdout, status.stdout + status.stderr

    mount = tmp_path / "data"
    mount.mkdir()
    with data_device(TMPFS / f"blkpilot-test-node-{os.getpid()}.img", 512 << 20, mount) as dev:
        workload = start_workload(dev.data_file, iodepth=1, engine="psync", device=dev.name)
        try:
            canary = subprocess.run(
                [
                    str(agent_venv / "bin" / "blkpilot"), "agent", "canary", dev.name,
                    "--mode", "live", "--scheduler", "mq-deadline", "--pairs", "4",
                    "--max-pairs", "4", "--no-report", "--state-dir", str(state),
                ],
                capture_output=True, text=True, timeout=300, check=False, cwd="/",
            )  # fmt: skip
        finally:
            stop_workload(workload)
        assert canary.returncode in (0, 1, 3), canary.stdout + canary.stderr
        assert "(live)" in canary.stdout
        scheduler = Path(f"/sys/block/{dev.name}/queue/scheduler").read_text()
        assert ("[mq-deadline]" if canary.returncode == 0 else "[none]") in scheduler
        Path(f"/sys/block/{dev.name}/queue/scheduler").write_text("none")


def test_without_the_object_status_says_why(agent_venv: Path, tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'ebpf_object = "{tmp_path / "nowhere.bpf.o"}"\n')
    status = _run(
        agent_venv, "blkpilot", "agent", "status", "--state-dir", str(tmp_path / "agent"),
        "--config", str(config),
    )  # fmt: skip
    assert "eBPF: UNAVAILABLE" in status.stdout, status.stdout + status.stderr
    assert "nowhere.bpf.o is missing" in status.stdout
