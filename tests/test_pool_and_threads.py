"""A real `blkpilot serve` with a small database pool under many concurrent requests: every
request is answered, none waits out the pool's timeout. (With AnyIO's 40 threads over a pool
of fewer connections, threads waiting for a connection could hold every thread while the
requests holding connections waited for one: all failed with 500 after 30 s.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

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
