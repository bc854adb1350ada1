"""No window can poison the fleet's telemetry (issue 31): generated windows — extreme but
schema-valid values, and text of any kind — go through ingest, the hourly rollup, retention
(roll up, then drop) and every page and endpoint that shows them. Each is refused at ingest
(4xx) or goes through all of it: never a 5xx, never an hour the upkeep cannot roll up.

On a database of its own: the upkeep commits and drops partitions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from agent.contract import histograms
from agent.contract.base import INT64_MAX, MAX_BYTES_PER_S, MAX_IOPS
from service.app import create_app
from service.db import Database
from service.security import SESSION_COOKIE, Role
from service.settings import Settings
from service.telemetry import retention
from service.telemetry.retention import RetentionPolicy, maintain
from tests.conftest import upkeep_database
from tests.factories import create_api_token, create_node, device_inventory, report_inventory

NAME = "blkpilot_test_poison"
POLICY = RetentionPolicy()


@pytest.fixture(scope="module")
def scratch(server_url: str) -> Iterator[Engine]:
    with upkeep_database(server_url, NAME, pool_size=4) as engine:
        yield engine


class Fleet:
    def __init__(self, engine: Engine, data_dir: Path) -> None:
        settings = Settings(
            database_url=str(engine.url), data_dir=data_dir, rate_limit="1000000/second"
        )
        self.engine = engine
        self.client = TestClient(create_app(settings, Database(engine)))
        with Session(engine, expire_on_commit=False) as session, session.begin():
            node, self.node_token = create_node(session, hostname="poison")
            (device,) = report_inventory(session, node, device_inventory("loop0"))
            self.device_id = device.id
            self.admin = create_api_token(session, role=Role.ADMIN, name="poison-admin")

    def reset(self) -> None:
        """No windows, hours, failures or batch ids: each example starts afresh."""
        with self.engine.begin() as connection:
            connection.execute(
                text(
                    "TRUNCATE telemetry_windows, telemetry_hourly, telemetry_batches,"
                    " telemetry_rollup_failures, telemetry_windows_set_aside"
                )
            )


@pytest.fixture(scope="module")
def fleet(scratch: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    found = Fleet(scratch, tmp_path_factory.mktemp("poison"))
    with found.client:
        yield found


def _measure(high: float) -> st.SearchStrategy[float]:
    return st.one_of(
        st.just(0.0), st.just(high), st.floats(0.0, high, allow_nan=False, allow_infinity=False)
    )


@st.composite
def windows(draw: st.DrawFn) -> dict[str, Any]:
    now = datetime.now(UTC)
    span = draw(st.sampled_from([1, 10, 59, 600, 3600]))
    # a start within the raw retention, ending before now
    back = draw(st.integers(span + 1, 10 * 86_400))
    start = (now - timedelta(seconds=back)).replace(microsecond=0)
    end = start + timedelta(seconds=span)
    ios_cap = int(MAX_IOPS * span)
    bytes_cap = int(MAX_BYTES_PER_S * span)
    reads = draw(st.one_of(st.just(0), st.just(ios_cap), st.integers(0, ios_cap)))
    writes = draw(st.integers(0, ios_cap - reads))
    if draw(st.integers(0, 5)) == 0:  # what a 64-bit counter allows: refused since issue 31
        reads, writes = INT64_MAX, draw(st.integers(1, INT64_MAX))
    read_bytes = draw(st.one_of(st.just(bytes_cap), st.integers(0, bytes_cap)))
    write_bytes = draw(st.integers(0, bytes_cap - read_bytes))
    window: dict[str, Any] = {
        "device": "loop0",
        "start": start.isoformat(),
        "end": end.isoformat(),
        "read_ios": reads,
        "write_ios": writes,
        "read_bytes": read_bytes,
        "write_bytes": write_bytes,
        "iops": draw(_measure(1e8)),
        "read_share": draw(_measure(1.0)),
        "mean_request_bytes": draw(_measure(float(1 << 32))),
        "mean_latency_us": draw(_measure(3.6e9)),
        "queue_depth": draw(_measure(1e6)),
        "utilisation": draw(_measure(1.0)),
        "cpu_utilisation": draw(st.none() | _measure(1.0)),
        "context_switches_per_s": draw(st.none() | _measure(1e10)),
        "latency_note": draw(st.text(max_size=40)),
    }
    if draw(st.booleans()):
        window.update(
            power_watts=draw(_measure(1e6)),
            energy_joules=draw(_measure(1e12)),
            power_scope=draw(st.sampled_from(["cpu_package", "system", "estimated"])),
            power_source=draw(st.sampled_from(["rapl", "ipmi", "estimate"])),
        )
    if draw(st.booleans()):
        window["latency_source"] = "ebpf"
        window["operations"] = [
            _operation("read", reads, draw(_measure(3.6e12))),
            _operation("write", writes, draw(_measure(3.6e12))),
        ]
    return window


def _operation(op: str, count: int, latency_ns: float) -> dict[str, Any]:
    device_ns = [(histograms.latency_slot(latency_ns), count)] if count else []
    percentiles = histograms.percentiles_us(device_ns)
    return {
        "op": op,
        "count": count,
        "device_ns": device_ns,
        "size_bytes": [(63, count)] if count else [],
        **{f"{name}_us": percentiles.get(name, 0.0) for name in histograms.PERCENTILES},
    }


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(windows(), min_size=1, max_size=4))
def test_a_window_is_refused_at_ingest_or_goes_all_the_way(
    fleet: Fleet, batch: list[dict[str, Any]]
) -> None:
    fleet.reset()
    client = fleet.client
    body = {"batch_id": str(uuid.uuid4()), "windows": batch}
    node = {"Authorization": f"Bearer {fleet.node_token}"}
    response = client.post("/api/v1/telemetry/batches", json=body, headers=node)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.json()["error"]  # refused, in the one error shape
        event(f"refused {response.status_code}")
        return
    event("stored")
    assert response.status_code == 201, response.text

    now = datetime.now(UTC)
    report = maintain(fleet.engine, POLICY, now + retention.SETTLE + timedelta(hours=1))
    assert report.failed_hours == [], report
    admin = {"Authorization": f"Bearer {fleet.admin}"}
    device = fleet.device_id
    for path in (
        f"/api/v1/devices/{device}/telemetry",
        f"/api/v1/devices/{device}/telemetry/hourly?since={(now - timedelta(days=11)).date()}",
        f"/api/v1/devices/{device}",
        "/api/v1/devices",
    ):
        shown = client.get(path, headers=admin)
        assert shown.status_code == 200, (path, shown.text)
    client.cookies.set(SESSION_COOKIE, fleet.admin)
    try:
        for page in ("/ui/", f"/ui/devices/{device}"):
            shown = client.get(page)
            assert shown.status_code == 200, (page, shown.text[-2000:])
    finally:
        client.cookies.clear()

    # past the raw retention: every day rolled up whole once more, then dropped
    later = maintain(fleet.engine, POLICY, now + timedelta(days=POLICY.raw_days + 12))
    assert later.failed_hours == [], later
    assert later.windows_set_aside == 0
    hourly = client.get(
        f"/api/v1/devices/{device}/telemetry/hourly?since={(now - timedelta(days=11)).date()}",
        headers=admin,
    )
    assert hourly.status_code == 200, hourly.text
    assert sum(h["windows"] for h in hourly.json()) == len(batch)
