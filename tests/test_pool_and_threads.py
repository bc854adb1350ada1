"""A real `blkpilot serve` with a small database pool under many concurrent requests: every
request is answered, none waits out the pool's timeout. (With AnyIO's 40 threads over a pool
of fewer connections, threads waiting for a connection could hold every thread while the
requests holding connections waited for one: all failed with 500 after 30 s.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from service.settings import Settings
from tests.conftest import create_database, drop_database
from tests.factories import device_inventory
from tests.proc import ServiceProcess


@pytest.mark.timeout(300)
def test_more_concurrent_requests_than_connections_all_succeed(tmp_path: Path) -> None:
    service = ServiceProcess(
        tmp_path,
        settings={
            "BLKPILOT_DB_POOL_SIZE": "2",
            "BLKPILOT_DB_MAX_OVERFLOW": "0",
            "BLKPILOT_RATE_LIMIT": "100000/second",
            "BLKPILOT_ROLLOUT_WORKER": "false",
        },
    )
    service.start()
    try:
        service.create_admin()
        headers = {"Authorization": f"Bearer {service.admin}"}

        async def burst() -> list[tuple[int, float]]:
            limits = httpx.Limits(max_connections=80)
            async with httpx.AsyncClient(
                base_url=service.base_url, headers=headers, timeout=120, limits=limits
            ) as client:

                async def one() -> tuple[int, float]:
                    began = time.perf_counter()
                    response = await client.post("/api/v1/enrollment-tokens", json={})
                    return response.status_code, time.perf_counter() - began

                return await asyncio.gather(*(one() for _ in range(80)))

        answers = asyncio.run(burst())
        assert [status for status, _ in answers] == [201] * 80
        # none waited out the pool's 30 s timeout
        assert max(seconds for _, seconds in answers) < 25
    finally:
        assert service.stop() == 0


def _sessions(url: str, database: str) -> int:
    """Sessions PostgreSQL has established to the database since it started."""
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        row = connection.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.timeout(300)
def test_a_steady_load_past_the_pool_opens_no_connection_per_request(
    tmp_path: Path, server_url: str
) -> None:
    """Nodes enrolling at the admission limit (an enrollment token, the enrolment, the
    inventory: three units of work each) reuse the pool's connections. A connection opened
    beyond the pool is closed when it is returned: with 10 + 10, every request past the pool
    was a new PostgreSQL backend (820-902 sessions for 1,500 enrolments, bench.fleet's 64 in
    flight), and PostgreSQL spent 6.6-7.4 ms of CPU a node against 2.8-3.3 with 10 + 0."""
    name = "pool_sessions"
    url = create_database(server_url, name)
    service = ServiceProcess(
        tmp_path,
        settings={
            "BLKPILOT_DATABASE_URL": url,
            "BLKPILOT_RATE_LIMIT": "100000/second",
            "BLKPILOT_ROLLOUT_WORKER": "false",
        },
    )
    service.start()
    try:
        service.create_admin()
        admin = {"Authorization": f"Bearer {service.admin}"}
        kept = Settings.model_fields["db_pool_size"].default
        inventory = {
            "devices": [device_inventory(f"loop{i}").model_dump(mode="json") for i in range(16)]
        }
        nodes = 200

        async def enrol_all() -> None:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(
                base_url=f"{service.base_url}/api/v1", timeout=120, limits=limits
            ) as client:
                gate = asyncio.Semaphore(64)  # bench.fleet's requests in flight

                async def enrol(index: int) -> None:
                    async with gate:
                        made = await client.post("/enrollment-tokens", json={}, headers=admin)
                        assert made.status_code == 201, made.text
                        token = made.json()["token"]
                        request = {"enrollment_token": token, "hostname": f"n{index}"}
                        enrolled = await client.post("/nodes", json=request)
                        assert enrolled.status_code == 201, enrolled.text
                        node = enrolled.json()
                        put = await client.put(
                            f"/nodes/{node['node']['id']}/inventory",
                            json=inventory,
                            headers={"Authorization": f"Bearer {node['node_token']}"},
                        )
                        assert put.status_code == 200, put.text

                await asyncio.gather(*(enrol(i) for i in range(nodes)))

        before = _sessions(url, name)
        asyncio.run(enrol_all())
        opened = _sessions(url, name) - before
        # at most the pool's own connections, each opened once — and two that PostgreSQL may
        # count late (a backend reports its session when it next reports its statistics):
        # the token-changes listener's, opened at start, and the first count's own
        assert opened <= kept + 2, f"{opened} sessions for {3 * nodes} requests"
    finally:
        try:
            assert service.stop() == 0
        finally:
            drop_database(server_url, name)
