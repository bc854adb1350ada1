"""The blkpilot_service role, run by the real ansible-playbook against this machine (local
connection) into a scratch prefix, with the test session's PostgreSQL server as the external
database: a virtualenv with the server extra, the schema migrated, a first admin token in a
root-only file, secrets only in root-only credential files, and a unit that systemd-analyze
accepts. Then the service is started as that unit starts it — its environment file, its
credentials directory, TLS from the credentials — and answers the admin token over TLS."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest
import trustme
from sqlalchemy.engine import make_url

from tests.conftest import _conninfo, drop_database
from tests.proc import assert_unit_verifies, free_port, run_playbook, stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _playbook(variables: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_playbook(
        "-i", "control-role-test,", "-c", "local", "-e", f"@{variables}",
        "-e", f"ansible_python_interpreter={sys.executable}", *extra, "service.yml",
        tmp_path=tmp_path,
    )  # fmt: skip


def _changed(run: subprocess.CompletedProcess[str]) -> list[str]:
    task, changed = "", []
    for line in run.stdout.splitlines():
        task = line if line.startswith("TASK [") else task
        if line.startswith("changed:"):
            changed.append(task)
    return changed


def _as_the_unit_starts_it(unit: str, credentials: Path) -> tuple[list[str], dict[str, str]]:
    """ExecStart and the environment systemd would give it: Environment=, EnvironmentFile=,
    and LoadCredential= copied into a credentials directory (%d)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLKPILOT_")}
    credentials.mkdir(mode=0o700)
    command: list[str] = []
    for line in unit.splitlines():
        key, _, value = line.partition("=")
        value = value.replace("%d", str(credentials))
        if key == "EnvironmentFile":
            for setting in Path(value).read_text().splitlines():
                if setting and not setting.startswith("#"):
                    name, _, given = setting.partition("=")
                    env[name] = given
        elif key == "Environment":
            for pair in value.split():
                name, _, given = pair.partition("=")
                env[name] = given
        elif key == "LoadCredential":
            name, _, source = value.partition(":")
            shutil.copyfile(source, credentials / name)
        elif key == "ExecStart":
            command = value.split()
    env["CREDENTIALS_DIRECTORY"] = str(credentials)
    return command, env


def test_service_role_deploys_serve_against_an_external_postgresql(
    server_url: str, tmp_path: Path
) -> None:
    prefix, etc, state, units = (tmp_path / d for d in ("opt", "etc", "state", "units"))
    units.mkdir()
    tls = tmp_path / "tls"
    tls.mkdir()
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    leaf.private_key_pem.write_to_path(str(tls / "key.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(tls / "cert.pem"))
    (tls / "key.pem").chmod(0o600)
    # the external database, as a DBA would hand it over: a role with a password, owning it
    database = user = f"blkpilot_role_{os.getpid()}"
    secret = secrets.token_hex(12)
    with psycopg.connect(_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        connection.execute(f'DROP ROLE IF EXISTS "{user}"')
        connection.execute(f"CREATE ROLE \"{user}\" LOGIN PASSWORD '{secret}'")
        connection.execute(f'CREATE DATABASE "{database}" OWNER "{user}"')
    server = make_url(server_url)
    url = server.set(
        drivername="postgresql+psycopg", username=user, password=secret, database=database
    ).render_as_string(hide_password=False)
    port = free_port()
    # what ships: the wheel (a second run then finds it installed, as it would a version
    # from an index)
    uv = shutil.which("uv")
    assert uv is not None, "uv is installed by `make test`; run the tests through it"
    built = subprocess.run(
        [uv, "build", "--wheel", "-q", "-o", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("blkpilot-*.whl")
    # and the locked versions of its dependencies, as `make dist` exports them
    constraints = tmp_path / "dist" / "constraints.txt"
    exported = subprocess.run(
        [uv, "export", "--frozen", "--all-extras", "--no-dev", "--no-hashes",
         "--no-emit-project", "--format", "requirements.txt", "-q", "-o", str(constraints)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    variables = {
        "blkpilot_service_prefix": str(prefix),
        "blkpilot_service_package": f"{wheel}[server]",
        "blkpilot_service_constraints": str(constraints),
        "blkpilot_install_os_packages": False,
        "blkpilot_service_create_user": False,
        "blkpilot_service_user": "root",
        "blkpilot_config_dir": str(etc),
        "blkpilot_service_state_dir": str(state),
        "blkpilot_systemd_dir": str(units),
        "blkpilot_service_unit": False,  # no systemd as PID 1 here
        "blkpilot_service_port": port,
        "blkpilot_database_url": url,
        "blkpilot_tls_certfile": str(tls / "cert.pem"),
        "blkpilot_tls_keyfile": str(tls / "key.pem"),
        "blkpilot_service_settings": {"BLKPILOT_ROLLOUT_WORKER": "false"},
        "blkpilot_python": shutil.which("python3") or "python3",
    }
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    serve = None
    try:
        # a dry run on the fresh host (issue 67): it says what it would do and does nothing
        dry = _playbook(tmp_path / "vars.json", tmp_path, "--check", "--diff")
        assert dry.returncode == 0, dry.stdout[-4000:] + dry.stderr[-2000:]
        assert secret not in dry.stdout + dry.stderr
        assert not prefix.exists()
        assert not etc.exists()
        assert any("service's virtualenv" in task for task in _changed(dry)), dry.stdout
        run = _playbook(tmp_path / "vars.json", tmp_path)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        assert secret not in run.stdout + run.stderr  # the URL's credentials: no_log
        assert any("Migrate the schema" in task for task in _changed(run)), run.stdout
        # exactly the locked versions (issue 67: the roles installed whatever pip resolved)
        from packaging.requirements import Requirement

        locked = {}
        for line in constraints.read_text().splitlines():
            if "==" not in line or line.startswith(("#", " ")):
                continue
            requirement = Requirement(line)  # a version per Python: its marker says which
            if requirement.marker is None or requirement.marker.evaluate():
                locked[requirement.name] = str(requirement.specifier).removeprefix("==")
        frozen = subprocess.run(
            [str(prefix / "bin" / "python"), "-m", "pip", "list", "--format", "freeze"],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        installed = dict(line.split("==") for line in frozen.splitlines() if "==" in line)
        normal = {k.lower().replace("_", "-"): v for k, v in installed.items()}
        checked = {name: normal.get(name.lower()) for name in locked if name.lower() in normal}
        assert len(checked) >= 20, checked  # the server's dependencies are there
        assert all(locked[name] == version for name, version in checked.items()), {
            name: (locked[name], version)
            for name, version in checked.items()
            if locked[name] != version
        }

        # secrets only in root-only files; the rest readable
        token_file, url_file = etc / "admin.token", etc / "credentials" / "database_url"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert url_file.stat().st_mode & 0o777 == 0o600
        assert (etc / "credentials").stat().st_mode & 0o777 == 0o700
        env_file = (etc / "service.env").read_text()
        assert "BLKPILOT_ENVIRONMENT=production" in env_file
        assert "BLKPILOT_ROLLOUT_WORKER=false" in env_file
        unit = (units / "blkpilot-service.service").read_text()
        assert secret not in env_file + unit
        assert f"ExecStart={prefix}/bin/blkpilot serve" in unit
        assert_unit_verifies(units / "blkpilot-service.service")

        # started as systemd would start it: over TLS, on the migrated external database,
        # and the admin token the role wrote works
        command, env = _as_the_unit_starts_it(unit, tmp_path / "credentials")
        assert "BLKPILOT_DATABASE_URL" not in env
        serve = subprocess.Popen(
            command,
            env=env,
            stdout=(tmp_path / "serve.log").open("w"),
            stderr=subprocess.STDOUT,
            text=True,
        )
        trusted = ssl.create_default_context(cafile=None)
        ca.configure_trust(trusted)
        base = f"https://127.0.0.1:{port}"
        wait_ready(f"{base}/readyz", serve, timeout=120, verify=trusted)
        token = token_file.read_text().strip()
        answer = httpx.get(
            f"{base}/api/v1/api-tokens",
            headers={"Authorization": f"Bearer {token}"},
            verify=trusted,
        )
        assert answer.status_code == 200, answer.text
        assert [t["name"] for t in answer.json()] == ["admin"]
        stop(serve)
        serve = None

        # again: nothing to do, and the token kept
        again = _playbook(tmp_path / "vars.json", tmp_path)
        assert again.returncode == 0, again.stdout[-3000:]
        assert _changed(again) == [], again.stdout
        assert token_file.read_text().strip() == token

        # a database it cannot reach: a clear failure, and still no password in the output
        nowhere = server.set(
            drivername="postgresql+psycopg", username=user, password=secret, database=database
        )
        if "host" in nowhere.query:  # a socket directory: one with no server in it
            nowhere = nowhere.update_query_dict({"host": str(tmp_path / "no-server")})
        else:
            nowhere = nowhere.set(port=free_port())
        variables["blkpilot_database_url"] = nowhere.render_as_string(hide_password=False)
        (tmp_path / "vars.json").write_text(json.dumps(variables))
        refused = _playbook(tmp_path / "vars.json", tmp_path)
        assert refused.returncode != 0
        assert "blkpilot db current failed" in refused.stdout, refused.stdout[-3000:]
        assert secret not in refused.stdout + refused.stderr
    finally:
        if serve is not None:
            stop(serve)
        drop_database(server_url, database)
        with psycopg.connect(_conninfo(server_url), autocommit=True) as connection:
            connection.execute(f'DROP ROLE IF EXISTS "{user}"')
