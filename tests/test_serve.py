"""`blkpilot serve` as a real process on the embedded default, used over loopback HTTP by the
real agent CLI and client."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.client import ServiceClient
from agent.contract.wire import Heartbeat, InventoryReport, TelemetryBatch, TelemetryWindow
from agent.errors import ServiceRejected, ServiceUnreachable
from agent.state import NodeState
from tests.factories import device_inventory, telemetry_window
from tests.proc import ServiceProcess, clean_env, free_port, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    service = ServiceProcess(tmp_path_factory.mktemp("served"))
    service.start()
    yield service
    # stopping the service stops the embedded PostgreSQL it started
    code = service.stop()
    assert code == 0, (service.data_dir / "serve.log").read_text()[-3000:]
    assert not (service.data_dir / "postgres" / "postmaster.pid").exists()


@pytest.fixture(scope="module")
def admin_token(served: ServiceProcess) -> str:
    token = served.create_admin("test-admin")
    assert token.startswith("bpo_")
    return token


def test_binds_loopback_by_default(served: ServiceProcess) -> None:
    assert served.base_url.startswith("http://127.0.0.1:")
    assert httpx.get(f"{served.base_url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{served.base_url}/readyz").json()["status"] == "ok"


def test_a_port_already_taken_ends_serve_with_uvicorns_startup_failure(
    served: ServiceProcess, tmp_path: Path
) -> None:
    """serve runs uvicorn's Server itself (service.runtime.Server): when it cannot bind, it
    still exits as uvicorn.run does — status 3, the reason in its log — and stops the
    embedded PostgreSQL it started."""
    port = int(served.base_url.rsplit(":", 1)[1])
    done = run("serve", "--port", str(port), env=clean_env(tmp_path))
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "address already in use" in (done.stdout + done.stderr).lower()
    assert not (tmp_path / "postgres" / "postmaster.pid").exists()


def test_an_idle_connection_outlives_the_clients_keep_alive(served: ServiceProcess) -> None:
    """A connection left idle longer than httpx keeps one (5 s) is still served: were the
    server to close it at 5 s too (uvicorn's default), a client reusing it as it closes gets
    a reset (bench/fleet.py did, about once in five runs)."""
    host, port = served.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        for pause in (0.0, 6.5):
            time.sleep(pause)
            conn.request("GET", "/healthz")  # on the one socket: http.client does not redial
            sock = conn.sock
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, b'{"status":"ok"}'), pause
            assert conn.sock is sock is not None, "the server closed the connection"
    finally:
        conn.close()


def test_openapi_is_served(served: ServiceProcess) -> None:
    spec = httpx.get(f"{served.base_url}/openapi.json").json()
    assert "/api/v1/telemetry/batches" in spec["paths"]


def test_agent_enrolls_reports_and_sends_telemetry(
    served: ServiceProcess, admin_token: str, tmp_path: Path
) -> None:
    enrollment = httpx.post(
        f"{served.base_url}/api/v1/enrollment-tokens",
        json={"labels": {"rack": "r1"}},
        headers={"Authorization": f"Bearer {admin_token}"},
    )
    assert enrollment.status_code == 201
    state_dir = tmp_path / "agent"
    enrolled = run(
        "agent",
        "enroll",
        "--server",
        served.base_url,
        "--token",
        enrollment.json()["token"],
        "--state-dir",
        str(state_dir),
        "--hostname",
        "lab-node",
        env=served.env,
    )
    assert enrolled.returncode == 0, enrolled.stderr
    assert (state_dir / "node.json").stat().st_mode & 0o777 == 0o600
    beat = run("agent", "heartbeat", "--state-dir", str(state_dir), env=served.env)
    assert beat.returncode == 0, beat.stderr

    # the same one-time token a second time: refused by the real service, reported clearly
    again = run(
        "agent",
        "enroll",
        "--server",
        served.base_url,
        "--token",
        enrollment.json()["token"],
        "--state-dir",
        str(tmp_path / "other"),
        env=served.env,
    )
    assert again.returncode == 1
    assert "401" in again.stderr

    state = NodeState.load(state_dir)
    with ServiceClient(state.server_url, state.node_token) as client:
        client.put_inventory(state.node_id, InventoryReport(devices=[device_inventory("loop0")]))
        batch = TelemetryBatch(
            batch_id=uuid.uuid4(),
            windows=[
                TelemetryWindow.model_validate(telemetry_window("loop0", index=i)) for i in range(3)
            ],
        )
        assert client.send_telemetry(batch).accepted is True
        assert client.send_telemetry(batch).accepted is False
        with pytest.raises(ServiceRejected) as refused:
            client.send_telemetry(
                TelemetryBatch(
                    batch_id=uuid.uuid4(),
                    windows=[TelemetryWindow.model_validate(telemetry_window("sdq"))],
                )
            )
        assert refused.value.status == 422
        assert "sdq" in refused.value.detail

    nodes = httpx.get(
        f"{served.base_url}/api/v1/nodes",
        params={"hostname": "lab-node"},
        headers={"Authorization": f"Bearer {admin_token}"},
    ).json()
    assert [n["labels"] for n in nodes] == [{"rack": "r1"}]


def test_agent_reports_an_unreachable_service(tmp_path: Path) -> None:
    with (
        ServiceClient(f"http://127.0.0.1:{free_port()}", "bpn_x", timeout=2) as client,
        pytest.raises(ServiceUnreachable),
    ):
        client.heartbeat(uuid.uuid4(), Heartbeat())


def test_db_current_reports_head(served: ServiceProcess) -> None:
    result = run("db", "current", env=served.env)
    assert result.returncode == 0, result.stderr
    current, head = result.stdout.split()[1], result.stdout.split()[3]
    assert current == head != "None"


def test_telemetry_maintain_runs_a_pass_by_hand(served: ServiceProcess) -> None:
    """The running service made the partitions at start; a pass by hand finds them there,
    and with a shorter raw retention it drops the days past it."""
    result = run("telemetry", "maintain", env=served.env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("created 0 partition(s), dropped 0 (none)")
    shorter = {**served.env, "BLKPILOT_TELEMETRY_RAW_DAYS": "3"}
    result = run("telemetry", "maintain", env=shorter)
    assert result.returncode == 0, result.stderr
    dropped = result.stdout.split("dropped ")[1].split()[0]
    assert int(dropped) >= 11  # 14 days ago to 4 days ago
    assert "telemetry_windows_p" in result.stdout


def test_production_refuses_the_embedded_database(tmp_path: Path) -> None:
    result = run("serve", env=clean_env(tmp_path, BLKPILOT_ENVIRONMENT="production"))
    assert result.returncode == 2
    assert "BLKPILOT_DATABASE_URL" in result.stderr


def test_tokens_are_listed_rotated_and_revoked_from_the_cli(served: ServiceProcess) -> None:
    """`blkpilot token create | list | rotate | revoke` through the running service's API with
    an admin token (issue 67: they went to the database, and with only a URL and a token set
    `token list` started an empty embedded PostgreSQL of its own): the list shows expiry and
    last use (UTC), rotation prints a new secret and stops the old one."""
    admin = served.create_admin(f"cli-admin-{uuid.uuid4().hex[:6]}")
    env = {**served.env, "BLKPILOT_URL": served.base_url, "BLKPILOT_TOKEN": admin}
    elsewhere = Path(served.data_dir).parent / f"elsewhere-{uuid.uuid4().hex[:6]}"
    elsewhere.mkdir()
    # a workstation with the URL and no token: said, and no database of its own started
    bare = run("token", "list", env={**clean_env(elsewhere), "BLKPILOT_URL": served.base_url,
                                     "HOME": str(elsewhere)})  # fmt: skip
    assert bare.returncode == 2, bare.stderr
    assert "no API token" in bare.stderr
    assert not (elsewhere / "postgres").exists()
    made = run("token", "create", "--name", "cli-ops", "--role", "operator", env=env)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.split()[-1]
    url = f"{served.base_url}/api/v1/nodes"
    assert httpx.get(url, headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    listed = run("token", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("cli-ops ")]
    assert "operator" in row
    assert "active" in row
    assert row.count("UTC") == 2  # expires in 90 days, used just now

    rotated = run("token", "rotate", "cli-ops", "--ttl-hours", "0", env=env)
    assert rotated.returncode == 0, rotated.stderr
    fresh = rotated.stdout.split()[-1]
    assert fresh != secret
    assert httpx.get(url, headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {fresh}"}).status_code == 200
    (row,) = [
        line
        for line in run("token", "list", env=env).stdout.splitlines()
        if line.startswith("cli-ops ")
    ]
    assert "never" in row

    # issue 67: a token past its expiry read "active" while the service refused it
    short = run("token", "create", "--name", "cli-short", "--role", "viewer", "--ttl-hours",
                "0.0003", env=env)  # fmt: skip
    assert short.returncode == 0, short.stderr
    time.sleep(1.5)
    assert (
        httpx.get(url, headers={"Authorization": f"Bearer {short.stdout.split()[-1]}"}).status_code
        == 401
    )
    (row,) = [
        line
        for line in run("token", "list", env=env).stdout.splitlines()
        if line.startswith("cli-short ")
    ]
    assert "expired" in row
    assert "active" not in row

    assert run("token", "revoke", "cli-ops", env=env).returncode == 0
    assert httpx.get(url, headers={"Authorization": f"Bearer {fresh}"}).status_code == 401
    missing = run("token", "rotate", "no-such-token", env=env)
    assert missing.returncode == 1
    assert "no active API token" in missing.stderr


def test_a_fixture_that_gives_up_stops_what_it_started(tmp_path: Path) -> None:
    """On a loaded host fixtures waited 90 s for `serve`, raised, and left it (and its embedded
    PostgreSQL) running an hour after the suite ended."""
    (tmp_path / "svc").mkdir()
    service = ServiceProcess(tmp_path / "svc", ready_timeout=0.5)  # never ready in time
    with pytest.raises(AssertionError, match=r"not ready|exited"):
        service.start()
    assert service.process is None
    leftovers = subprocess.run(
        ["pgrep", "-f", f"serve --port {service.port}$"], capture_output=True, text=True
    )
    assert leftovers.stdout == "", leftovers.stdout
    time.sleep(1)
    assert not (tmp_path / "svc" / "postgres" / "postmaster.pid").exists()


def test_an_operator_runs_the_nightly_job_through_the_api(served: ServiceProcess) -> None:
    """`blkpilot nightly --url` from a workstation (issue 67: it worked on the database only):
    queued in the service, run by its nightly worker, followed until it ends, its report
    printed; audited; a viewer cannot queue one; one at a time."""
    admin = served.create_admin(f"nightly-admin-{uuid.uuid4().hex[:6]}")
    workstation = Path(served.data_dir).parent / f"ws-{uuid.uuid4().hex[:6]}"
    workstation.mkdir()
    env = {**clean_env(workstation), "HOME": str(workstation), "BLKPILOT_TOKEN": admin}
    done = run("nightly", "--url", served.base_url, "--local", "--max-canaries", "0", env=env)
    assert done.returncode == 0, done.stderr
    assert "queued in" in done.stderr
    assert "nightly run" in done.stdout, done.stdout
    assert "observations" in done.stdout, done.stdout
    assert not (workstation / "postgres").exists()  # nothing of its own started
    headers = {"Authorization": f"Bearer {admin}"}
    runs = httpx.get(f"{served.base_url}/api/v1/nightly-runs", headers=headers).json()
    latest = runs[0]
    assert latest["status"] == "done", latest
    assert latest["options"]["local"] is True
    assert latest["options"]["max_canaries"] == 0
    assert latest["report"]["samples"] >= 0
    assert latest["started_at"]
    assert latest["finished_at"]
    events = httpx.get(
        f"{served.base_url}/api/v1/audit", headers=headers, params={"action": "nightly.queued"}
    ).json()
    assert any(e["target_id"] == latest["id"] for e in events), events

    made = run("token", "create", "--name", f"v-{uuid.uuid4().hex[:6]}", "--role", "viewer",
               env={**env, "BLKPILOT_URL": served.base_url})  # fmt: skip
    assert made.returncode == 0, made.stderr
    viewer = {"Authorization": f"Bearer {made.stdout.split()[-1]}"}
    url = f"{served.base_url}/api/v1/nightly-runs"
    assert httpx.post(url, headers=viewer, json={}).status_code == 403
    assert httpx.post(url, headers=headers, json={"max_canaries": -1}).status_code == 422
    # queued without waiting, then a second while it is open: refused
    first = run("nightly", "--url", served.base_url, "--local", "--no-wait", env=env)
    assert first.returncode == 0, first.stderr
    first_id = json.loads(first.stdout)["id"]
    second = httpx.post(url, headers=headers, json={"local": True})
    if second.status_code != 409:  # only where the first had already ended
        assert second.status_code == 202, second.text
        assert httpx.get(f"{url}/{first_id}", headers=headers).json()["status"] == "done"
    else:
        assert first_id in second.json()["detail"], second.text
    deadline = time.monotonic() + 120
    while httpx.get(url, headers=headers).json()[0]["status"] in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
