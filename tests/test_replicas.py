"""Two real `blkpilot serve` processes on one database, as a deployment that outgrew one
replica runs them: a batch sent to both at once is stored once; what one stores, the other
reads; both run the telemetry upkeep, one pass at a time, and neither fails; a node or an
operator's token revoked through one is refused by the other at once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.embedded import EmbeddedPostgres
from tests.factories import device_inventory, telemetry_window
from tests.proc import ServiceProcess


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    database = EmbeddedPostgres(tmp_path / "db")
    url = database.start()
    settings = {"BLKPILOT_DATABASE_URL": url, "BLKPILOT_TELEMETRY_UPKEEP_SECONDS": "1"}
    started: list[ServiceProcess] = []
    try:
        for name in ("a", "b"):  # one after the other: each upgrades the schema at start
            (tmp_path / name).mkdir()
            replica = ServiceProcess(tmp_path / name, settings=settings)
            replica.start()
            started.append(replica)
        started[0].create_admin()
        started[1].admin = started[0].admin
        yield started[0], started[1]
    finally:
        for replica in started:
            if replica.process is not None:
                assert replica.stop() == 0
        database.stop()


def _upkeep(replica: ServiceProcess) -> dict[str, float]:
    text = httpx.get(f"{replica.base_url}/metrics").text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "blkpilot_telemetry_upkeep_passes"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


@pytest.mark.timeout(300)
def test_two_replicas_store_a_batch_once_and_share_the_upkeep(
    replicas: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = replicas
    enrollment = a.api("POST", "/enrollment-tokens", json={}).json()["token"]
    enrolled = httpx.post(
        f"{b.base_url}/api/v1/nodes", json={"enrollment_token": enrollment, "hostname": "n1"}
    ).json()
    node = {"Authorization": f"Bearer {enrolled['node_token']}"}
    inventory = {"devices": [device_inventory("loop0").model_dump(mode="json")]}
    where = f"{a.base_url}/api/v1/nodes/{enrolled['node']['id']}/inventory"
    put = httpx.put(where, json=inventory, headers=node)
    assert put.status_code == 200, put.text

    # yesterday and today: two day partitions in one batch
    now = datetime.now(UTC).replace(microsecond=0)
    starts = [now - timedelta(days=1, minutes=10), now - timedelta(minutes=10)]
    windows = [
        telemetry_window(start=s.isoformat(), end=(s + timedelta(seconds=10)).isoformat())
        for s in starts
    ]
    batch = {"batch_id": str(uuid.uuid4()), "windows": windows}
    with ThreadPoolExecutor(2) as pool:
        posted = list(
            pool.map(
                lambda r: httpx.post(
                    f"{r.base_url}/api/v1/telemetry/batches", json=batch, headers=node
                ),
                (a, b),
            )
        )
    assert sorted(r.status_code for r in posted) == [200, 201], [r.text for r in posted]
    assert sorted(r.json()["accepted"] for r in posted) == [False, True]

    device = b.api("GET", "/devices").json()[0]["id"]
    for replica in (a, b):
        stored = replica.api("GET", f"/devices/{device}/telemetry").json()
        assert sorted(datetime.fromisoformat(w["window_start"]) for w in stored) == starts

    # both replicas run the upkeep every second; passes never overlap, and none fails
    deadline = datetime.now(UTC) + timedelta(seconds=60)
    while datetime.now(UTC) < deadline:
        counts = [_upkeep(r) for r in (a, b)]
        if all(c.get("ran", 0) + c.get("skipped", 0) >= 2 for c in counts):
            break
        time.sleep(0.5)
    assert all(c.get("ran", 0) + c.get("skipped", 0) >= 2 for c in counts), counts
    assert sum(c.get("ran", 0) for c in counts) >= 1
    assert all(c.get("failed", 0) == 0 for c in counts), counts

    # a node revoked through one replica is refused by the other within moments: it hears the
    # commit, where it used to keep the token it had checked for up to 10 s (and now keeps one
    # for 10 minutes while it hears)
    own = f"{a.base_url}/api/v1/nodes/{enrolled['node']['id']}"
    assert httpx.get(own, headers=node).status_code == 200  # checked by a: kept there
    revoked = b.api("POST", f"/nodes/{enrolled['node']['id']}/revoke", json={"reason": "lost"})
    assert revoked.status_code == 200, revoked.text
    heard_by = time.monotonic() + 5
    while (status := httpx.get(own, headers=node).status_code) == 200:
        if time.monotonic() > heard_by:
            break
        time.sleep(0.05)
    assert status == 401

    # so is an operator's API token (kept by a replica only while it hears every change)
    made = a.api("POST", "/api-tokens", json={"name": "ops", "role": "viewer"})
    assert made.status_code == 201, made.text
    ops = {"Authorization": f"Bearer {made.json()['token']}"}
    assert httpx.get(f"{a.base_url}/api/v1/nodes", headers=ops).status_code == 200
    gone = b.api("DELETE", f"/api-tokens/{made.json()['id']}")
    assert gone.status_code == 200, gone.text
    heard_by = time.monotonic() + 5
    while (status := httpx.get(f"{a.base_url}/api/v1/nodes", headers=ops).status_code) == 200:
        if time.monotonic() > heard_by:
            break
        time.sleep(0.05)
    assert status == 401
