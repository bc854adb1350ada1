"""A rate limit per token: one agent that floods the service gets 429 with Retry-After, the
others are served meanwhile, and the agent's client holds off as told without losing a
telemetry window (the spool keeps them)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agent.client import DEFAULT_RETRY_AFTER_S, ServiceClient, retry_after_seconds
from agent.contract.wire import TelemetryBatch
from agent.errors import RateLimited
from agent.spool import Spool
from service.ops.ratelimit import SlidingWindowCounters, parse_limits
from service.security import Role
from service.settings import Settings
from service.tables import TelemetryWindowRow
from tests.factories import (
    create_api_token,
    create_node,
    device_inventory,
    report_inventory,
    telemetry_window,
)

# Counting tests use a budget per minute, which no slowness of a busy machine can stretch; the
# tests of waiting use one per second, and send at a pace a busy machine still passes.
PER_MINUTE, PER_SECOND = "4/minute", "2/second"


@pytest.fixture
def settings(request: pytest.FixtureRequest, tmp_path: Path, database_url: str) -> Settings:
    limit = getattr(request, "param", PER_SECOND)
    return Settings(database_url=database_url, data_dir=tmp_path, rate_limit=limit)


per_minute = pytest.mark.parametrize("settings", [PER_MINUTE], indirect=True)


@pytest.fixture
def limited(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@per_minute
def test_a_flooding_token_is_refused_and_the_others_are_served(
    limited: TestClient, session: Session
) -> None:
    flood = {"Authorization": f"Bearer {create_api_token(session, role=Role.ADMIN)}"}
    other = {"Authorization": f"Bearer {create_api_token(session, role=Role.VIEWER)}"}
    codes = [limited.get("/api/v1/nodes", headers=flood).status_code for _ in range(12)]
    assert codes == [200] * 4 + [429] * 8
    refused = limited.get("/api/v1/nodes", headers=flood)
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 1
    body = refused.json()
    assert body["error"] == "rate_limited"
    assert "4 per 1 minute" in body["detail"]
    assert body["fields"] == []
    # the other token has its own budget: not starved by the flood
    assert limited.get("/api/v1/nodes", headers=other).status_code == 200
    # probes are never limited; the refusals are counted by kind of caller
    assert all(limited.get("/healthz").status_code == 200 for _ in range(10))
    scraped = limited.get("/metrics").text
    assert 'blkpilot_rate_limited_requests_total{caller="operator"}' in scraped


@per_minute
def test_unauthenticated_callers_are_limited_by_address(limited: TestClient) -> None:
    codes = {limited.get("/api/v1/nodes").status_code for _ in range(10)}
    assert codes == {401, 429}


def test_a_bad_limit_setting_is_refused(database_url: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="BLKPILOT_RATE_LIMIT 'lots'"):
        Settings(database_url=database_url, data_dir=tmp_path, rate_limit="lots")


def test_retry_after_as_seconds_or_a_date() -> None:
    assert retry_after_seconds("7") == 7.0
    now = time.time()
    later = format_datetime(datetime.fromtimestamp(now, UTC) + timedelta(seconds=30), usegmt=True)
    assert retry_after_seconds(later, now=now) == pytest.approx(30, abs=1)
    assert retry_after_seconds(None) == DEFAULT_RETRY_AFTER_S
    assert retry_after_seconds("soon") == DEFAULT_RETRY_AFTER_S
    assert retry_after_seconds("99999999") == 3600.0


def test_the_agent_holds_off_and_loses_no_window(
    limited: TestClient, session: Session, tmp_path: Path
) -> None:
    node, node_token = create_node(session)
    report_inventory(session, node, device_inventory("loop0"))
    agent = ServiceClient(
        str(limited.base_url),
        node_token,
        transport=limited._transport,  # the app, in process
        max_wait_s=0,  # the agent's loop: never blocked, the spool holds the windows
    )
    spool = Spool(tmp_path / "spool", max_batches=100, max_bytes=10 << 20)
    batches = [
        TelemetryBatch.model_validate(
            {"batch_id": str(uuid.uuid4()), "windows": [telemetry_window("loop0", index=i)]}
        )
        for i in range(10)
    ]
    for batch in batches:
        spool.put(batch)
    sent, requests_made, holds_checked = 0, [], 0
    deadline = time.monotonic() + 60
    while spool.pending() and time.monotonic() < deadline:
        before = _served(limited)
        result = spool.drain(agent.send_telemetry)
        requests_made.append(_served(limited) - before)
        sent += result.sent
        if result.stopped:
            assert "429" in result.stopped
            assert agent.held_for() <= 1.0
            # held off: a call now does not reach the service at all — while the hold lasts
            # (the service may name a few ms, which a busy host can spend before this line)
            if agent.held_for() > 0.05:
                with pytest.raises(RateLimited) as held:
                    agent.send_telemetry(batches[0])
                assert 0 < held.value.retry_after <= 1.0
                assert _served(limited) == before + requests_made[-1]
                holds_checked += 1
            time.sleep(agent.held_for())
    assert not spool.pending(), "windows left in the spool"
    assert sent == len(batches)  # every window delivered once, none dropped or rejected
    assert not list((tmp_path / "spool" / "rejected").glob("*"))
    assert len(requests_made) > 1  # it was limited on the way
    assert holds_checked > 0  # and held off at least once
    assert session.scalar(select(func.count()).select_from(TelemetryWindowRow)) == len(batches)


def _served(client: TestClient) -> float:
    """Telemetry batch requests the service answered (any status), from its own metrics."""
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("blkpilot_http_requests_total{") and "/telemetry/batches" in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@per_minute
def test_the_dashboards_cookie_counts_against_its_token(
    limited: TestClient, session: Session
) -> None:
    token = create_api_token(session, role=Role.VIEWER)
    limited.cookies.set("blkpilot_ui", token)
    codes = [limited.get("/ui/").status_code for _ in range(8)]
    assert 429 in codes
    limited.cookies.clear()
    # the same token as a bearer shares that budget; another caller does not
    assert (
        limited.get("/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}).status_code
        == 429
    )
    fresh = create_api_token(session, role=Role.VIEWER)
    assert (
        limited.get("/api/v1/nodes", headers={"Authorization": f"Bearer {fresh}"}).status_code
        == 200
    )


def test_a_command_waits_out_retry_after_and_gets_through(
    limited: TestClient, session: Session
) -> None:
    """Bulk reporters (a lab's observations, a canary's report) honour Retry-After by waiting
    and trying again, within their bound; past the bound they are told."""
    node, node_token = create_node(session)
    report_inventory(session, node, device_inventory("loop0"))
    patient = ServiceClient(
        str(limited.base_url), node_token, transport=limited._transport, max_wait_s=30
    )
    refused_before = _refused(limited)
    started = time.monotonic()
    for _ in range(10):  # 10 calls through 2 per second
        assert patient.devices(node.id)[0]["name"] == "loop0"
    assert _refused(limited) > refused_before  # it was limited on the way ...
    assert time.monotonic() - started >= 2.0  # ... and waited rather than failed
    impatient = ServiceClient(
        str(limited.base_url), node_token, transport=limited._transport, max_wait_s=0
    )
    answered = 0
    with pytest.raises(RateLimited):  # noqa: PT012 — which call is refused depends on the clock
        for _ in range(10):
            impatient.devices(node.id)
            answered += 1
    assert answered < 10


def _refused(client: TestClient) -> float:
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("blkpilot_rate_limited_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_counters_slide_as_limits_does_and_say_when_a_hit_fits() -> None:
    """SlidingWindowCounters on a clock of its own: `amount` hits fit in a window, the next is
    refused with the exact wait; in the next window the previous one's hits weigh by the share
    of it the sliding window still covers."""
    (minute,) = parse_limits("4/minute")
    counters = SlidingWindowCounters([minute])
    t0 = 600.0  # the start of a window (600 // 60)
    assert [counters.hit("a", t0 + i) for i in range(4)] == [[]] * 4
    ((item, wait),) = counters.hit("a", t0 + 10)
    # this window is full: a hit fits once the next one starts (its 4 then weigh under 4)
    assert item is minute
    assert wait == pytest.approx(50.0)
    assert counters.hit("b", t0 + 10) == []  # another caller has its own budget
    # 15 s into the next window the previous 4 weigh 4 * 0.75 = 3: a hit fits, and at 16 s
    # another (4 * 44/60 + 1 = 3.93); at 17 s, 4 * 43/60 + 2 = 4.87 does not, until the
    # previous window's weight has fallen to 2: 30 s into this one, 13 s on
    assert counters.hit("a", t0 + 75) == []
    assert counters.hit("a", t0 + 76) == []
    ((_, wait),) = counters.hit("a", t0 + 77)
    assert wait == pytest.approx(13.0)


def test_the_wait_is_when_a_hit_is_counted_again() -> None:
    (second,) = parse_limits("2/second")
    counters = SlidingWindowCounters([second])
    assert counters.hit("a", 100.0) == []
    assert counters.hit("a", 100.1) == []
    ((_, wait),) = counters.hit("a", 100.2)
    assert counters.hit("a", 100.2 + wait - 0.01) != []
    assert counters.hit("a", 100.2 + wait + 0.01) == []


def test_callers_not_heard_from_are_forgotten_and_no_thread_is_started() -> None:
    """A hit starts no thread (limits' MemoryStorage started a timer thread whenever the last
    had fired: under load, a thread a request), and counters of callers gone quiet for two
    windows are dropped, so 10,000 nodes heard from once do not stay."""
    counters = SlidingWindowCounters(parse_limits("50/second;1000/minute"))
    threads = threading.active_count()
    for node in range(10_000):
        counters.hit(f"token:{node}", 1_000.0 + node / 10_000)
    assert threading.active_count() == threads
    assert len(counters) == 20_000
    counters.hit("token:0", 1_000.0 + 121)  # two minutes on: only the caller heard from now
    assert len(counters) == 2
