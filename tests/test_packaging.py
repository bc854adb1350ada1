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
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
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
