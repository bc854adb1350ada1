from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from agent.contract.base import MAX_CLOCK_SKEW, MAX_WINDOWS_PER_BATCH
from service.ops import metrics
from service.security import Role
from service.tables import Node, TelemetryBatchRow, TelemetryWindowRow
from tests.factories import (
    bearer,
    create_api_token,
    create_node,
    device_inventory,
    ebpf_window,
    rapl_window,
    report_inventory,
    telemetry_window,
)

URL = "/api/v1/telemetry/batches"


@pytest.fixture
def node(session: Session) -> tuple[Node, str]:
    node, token = create_node(session)
    report_inventory(session, node, device_inventory("loop0"), device_inventory("loop1"))
    return node, token


def _batch(*windows: dict[str, Any], batch_id: uuid.UUID | None = None) -> dict[str, Any]:
    return {"batch_id": str(batch_id or uuid.uuid4()), "windows": list(windows)}


def _stored(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(TelemetryWindowRow)) or 0


def _counter(counter: Any, **labels: str) -> float:
    sample = counter.labels(**labels) if labels else counter
    return float(sample._value.get())


class TestIngestBatch:
    @pytest.mark.parametrize(
        "start",
        ["9999-12-31T12:00:00+00:00", "0001-01-01T00:00:00+00:00", "1900-01-01T00:00:00+00:00"],
    )
    def test_refuses_windows_dated_where_no_telemetry_can_be(
        self, client: TestClient, session: Session, node: tuple[Node, str], start: str
    ) -> None:
        """One window from a node whose clock is wrong: 422 naming it, nothing stored."""
        _, token = node
        bad = telemetry_window("loop0", start=start)
        bad["end"] = (datetime.fromisoformat(start) + timedelta(seconds=10)).isoformat()
        body = _batch(telemetry_window("loop0"), bad)
        response = client.post(URL, json=body, headers=bearer(token))
        assert response.status_code == 422, response.text
        assert any(f["loc"][:3] == ["body", "windows", 1] for f in response.json()["fields"])
        assert _stored(session) == 0

    @pytest.mark.parametrize(
        "lax",
        [
            {"read_ios": "123"},  # a numeric string: was stored as 123
            {"write_ios": True},  # a boolean: was stored as 1
            {"iops": 1e308},  # was stored, and ranked first
            {"mean_latency_us": 1e308},
            {"read_share": "0.5"},
            {"queue_depth": 2e6},
            # more than any device does in one window: INT64_MAX was stored, and stopped the
            # hourly rollup on every pass
            {"read_ios": 9223372036854775807},
            {"write_bytes": 9223372036854775807},
            {"read_ios": 360_000_000_001},
        ],
    )
    def test_lax_numbers_are_refused(
        self, client: TestClient, session: Session, node: tuple[Node, str], lax: dict[str, Any]
    ) -> None:
        _, token = node
        response = client.post(
            URL, json=_batch(telemetry_window("loop0", **lax)), headers=bearer(token)
        )
        assert response.status_code == 422, response.text
        (field,) = lax
        assert response.json()["fields"][0]["loc"] == ["body", "windows", 0, field]
        assert _stored(session) == 0

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("read_ios", 1_000_000_001, "I/Os per second"),  # 1e9 in 10 s
            ("write_bytes", 2_000_000_000_000, "bytes per second"),  # 2 TB in 10 s
        ],
    )
    def test_counts_beyond_what_a_device_does_in_the_span_are_refused(
        self,
        client: TestClient,
        session: Session,
        node: tuple[Node, str],
        field: str,
        value: int,
        message: str,
    ) -> None:
        _, token = node
        response = client.post(
            URL, json=_batch(telemetry_window("loop0", **{field: value})), headers=bearer(token)
        )
        assert response.status_code == 422, response.text
        assert message in response.text
        assert _stored(session) == 0

    def test_a_window_ahead_by_more_than_the_clock_skew_is_refused(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        soon = datetime.now(UTC) + MAX_CLOCK_SKEW / 2  # a clock a little ahead: fine
        later = datetime.now(UTC) + 2 * MAX_CLOCK_SKEW
        ok = telemetry_window(
            "loop0", start=soon.isoformat(), end=(soon + timedelta(seconds=10)).isoformat()
        )
        assert client.post(URL, json=_batch(ok), headers=bearer(token)).status_code == 201
        ahead = telemetry_window(
            "loop1", start=later.isoformat(), end=(later + timedelta(seconds=10)).isoformat()
        )
        response = client.post(URL, json=_batch(ahead), headers=bearer(token))
        assert response.status_code == 422, response.text
        assert "clock" in response.json()["detail"]
        assert response.json()["fields"][0]["loc"] == ["body", "windows", 0, "end"]
        assert _stored(session) == 1

    def test_stores_every_window(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        windows = [telemetry_window("loop0", index=i) for i in range(3)]
        windows.append(
            telemetry_window(
                "loop1", index=0, power_watts=12.5, energy_joules=125.0, power_scope="cpu_package"
            )
        )
        accepted_before = _counter(metrics.TELEMETRY_WINDOWS)
        response = client.post(URL, json=_batch(*windows), headers=bearer(token))
        assert response.status_code == 201, response.text
        assert response.json()["accepted"] is True
        assert response.json()["windows"] == 4
        assert _stored(session) == 4
        assert _counter(metrics.TELEMETRY_WINDOWS) - accepted_before == 4
        powered = session.scalars(
            select(TelemetryWindowRow).where(TelemetryWindowRow.power_watts.is_not(None))
        ).one()
        assert (powered.energy_joules, powered.power_scope) == (125.0, "cpu_package")

    def test_text_and_json_that_need_escaping_are_stored_as_sent(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        """The windows go to PostgreSQL as JSON the service encodes (service.encode_batch): a
        backslash, tab, newline, carriage return or quote in free text or inside a JSON
        column comes back as sent, and every number as the same double."""
        _, token = node
        note = 'no eBPF: C:\\path\ttab\nnewline\rreturn "quoted" \u00e9'
        zone = "zone\\with\tescapes"
        window = rapl_window("loop0", zone=zone, latency_note=note)
        response = client.post(URL, json=_batch(window), headers=bearer(token))
        assert response.status_code == 201, response.text
        stored = session.scalars(select(TelemetryWindowRow)).one()
        assert stored.latency_note == note
        assert stored.power_watts == 17.123456789012345
        assert stored.energy_joules == 1e-7
        assert stored.power_readings is not None
        assert stored.power_readings[0]["zone"] == zone
        assert stored.power_readings[0]["watts"] == 17.123456789012345

    def test_a_repeated_batch_is_accepted_once(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        batch = _batch(telemetry_window("loop0", index=0), telemetry_window("loop0", index=1))
        duplicates_before = _counter(metrics.TELEMETRY_BATCHES, outcome="duplicate")
        first = client.post(URL, json=batch, headers=bearer(token))
        again = client.post(URL, json=batch, headers=bearer(token))
        assert first.status_code == 201
        assert again.status_code == 200
        assert again.json() == {"batch_id": batch["batch_id"], "accepted": False, "windows": 0}
        assert _stored(session) == 2
        assert _counter(metrics.TELEMETRY_BATCHES, outcome="duplicate") - duplicates_before == 1

    def test_unknown_device_rejects_the_whole_batch(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        good = telemetry_window("loop0", index=0)
        batch_id = uuid.uuid4()
        response = client.post(
            URL,
            json=_batch(good, telemetry_window("sdz", index=0), batch_id=batch_id),
            headers=bearer(token),
        )
        assert response.status_code == 422
        body = response.json()
        assert "sdz" in body["detail"]
        assert body["fields"] == [
            {"loc": ["body", "windows", 1, "device"], "msg": "unknown device 'sdz'"}
        ]
        assert _stored(session) == 0
        # the batch id was not used up: the corrected batch goes through under the same id
        fixed = client.post(URL, json=_batch(good, batch_id=batch_id), headers=bearer(token))
        assert fixed.status_code == 201
        assert _stored(session) == 1

    def test_windows_of_a_device_since_removed_are_still_accepted(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        the_node, token = node
        report_inventory(session, the_node, device_inventory("loop0"))  # loop1 went away
        response = client.post(URL, json=_batch(telemetry_window("loop1")), headers=bearer(token))
        assert response.status_code == 201
        assert _stored(session) == 1

    def test_another_nodes_device_is_unknown_to_this_node(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        other, _ = create_node(session, hostname="other")
        report_inventory(session, other, device_inventory("nvme0n1"))
        _, token = node
        response = client.post(URL, json=_batch(telemetry_window("nvme0n1")), headers=bearer(token))
        assert response.status_code == 422
        assert _stored(session) == 0

    @pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
    def test_non_finite_numbers_are_rejected(
        self, client: TestClient, session: Session, node: tuple[Node, str], literal: str
    ) -> None:
        _, token = node
        text = json.dumps(_batch(telemetry_window("loop0"))).replace(
            '"mean_latency_us": 85.5', f'"mean_latency_us": {literal}'
        )
        assert literal in text
        response = client.post(
            URL, content=text, headers={**bearer(token), "Content-Type": "application/json"}
        )
        assert response.status_code == 422
        assert response.json()["fields"][0]["loc"] == ["body", "windows", 0, "mean_latency_us"]
        assert _stored(session) == 0

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("read_ios", -1),
            ("read_ios", 2**63),  # would overflow the database's BIGINT
            ("write_bytes", -4096),
            ("iops", -0.5),
            ("read_share", 1.5),
            ("utilisation", -0.1),
            ("end", "2026-11-01T11:59:00+00:00"),
            ("start", "2026-11-01T12:00:00"),  # no timezone
            ("power_watts", 10.0),  # without a scope
            ("surprise", 1),
        ],
    )
    def test_bad_windows_are_rejected_naming_the_field(
        self, client: TestClient, session: Session, node: tuple[Node, str], field: str, value: Any
    ) -> None:
        _, token = node
        bad = telemetry_window("loop0", index=1, **{field: value})
        response = client.post(
            URL, json=_batch(telemetry_window("loop0", index=0), bad), headers=bearer(token)
        )
        assert response.status_code == 422, response.text
        locs = [field_error["loc"] for field_error in response.json()["fields"]]
        assert any(loc[:3] == ["body", "windows", 1] for loc in locs), locs
        assert _stored(session) == 0

    def test_oversized_batch_is_rejected(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        windows = [telemetry_window("loop0", index=i) for i in range(MAX_WINDOWS_PER_BATCH + 1)]
        response = client.post(URL, json=_batch(*windows), headers=bearer(token))
        assert response.status_code == 422
        assert f"at most {MAX_WINDOWS_PER_BATCH}" in response.json()["detail"]
        assert _stored(session) == 0

    def test_body_over_the_byte_limit_is_413(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        padding = "x" * (5 * 1024 * 1024)  # the test settings cap bodies at 4 MiB
        response = client.post(
            URL,
            content=json.dumps({"batch_id": str(uuid.uuid4()), "windows": [], "pad": padding}),
            headers={**bearer(token), "Content-Type": "application/json"},
        )
        assert response.status_code == 413
        assert response.json()["error"] == "payload_too_large"

    def test_a_chunked_body_over_the_limit_without_a_length_is_413(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        """No Content-Length: the limit is met while the body is read (it was a 422)."""
        _, token = node
        payload = json.dumps({"batch_id": str(uuid.uuid4()), "windows": [], "pad": "x" * (5 << 20)})

        def chunks() -> Iterator[bytes]:
            data = payload.encode()
            for at in range(0, len(data), 64 << 10):
                yield data[at : at + (64 << 10)]

        response = client.post(
            URL, content=chunks(), headers={**bearer(token), "Content-Type": "application/json"}
        )
        assert "content-length" not in {k.lower() for k in response.request.headers}
        assert response.status_code == 413, response.text
        assert response.json() == {
            "error": "payload_too_large",
            "detail": "request body exceeds 4194304 bytes",
            "fields": [],
        }
        assert _stored(session) == 0

    def test_every_error_has_the_one_shape(self, client: TestClient) -> None:
        """error, detail and fields, whatever the status (fields was left out but for 422)."""
        for response in (
            client.post(URL, json=_batch(telemetry_window())),  # 401
            client.get("/api/v1/devices/00000000-0000-0000-0000-000000000000"),  # 401
            client.delete(URL),  # 405
        ):
            assert response.status_code in (401, 404, 405)
            assert set(response.json()) == {"error", "detail", "fields"}, response.json()

    def test_empty_batch_is_rejected(self, client: TestClient, node: tuple[Node, str]) -> None:
        _, token = node
        response = client.post(URL, json=_batch(), headers=bearer(token))
        assert response.status_code == 422

    def test_same_window_twice_in_a_batch_is_rejected(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        window = telemetry_window("loop0")
        response = client.post(URL, json=_batch(window, window), headers=bearer(token))
        assert response.status_code == 422
        assert _stored(session) == 0

    def test_window_already_stored_by_another_batch_is_409_and_nothing_stored(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        client.post(URL, json=_batch(telemetry_window("loop0", index=0)), headers=bearer(token))
        response = client.post(
            URL,
            json=_batch(telemetry_window("loop0", index=1), telemetry_window("loop0", index=0)),
            headers=bearer(token),
        )
        assert response.status_code == 409
        assert _stored(session) == 1
        assert session.scalar(select(func.count()).select_from(TelemetryBatchRow)) == 1

    def test_batch_id_of_another_node_is_409(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        other, other_token = create_node(session, hostname="other")
        report_inventory(session, other, device_inventory("loop0"))
        _, token = node
        batch_id = uuid.uuid4()
        client.post(
            URL, json=_batch(telemetry_window("loop0"), batch_id=batch_id), headers=bearer(token)
        )
        response = client.post(
            URL,
            json=_batch(telemetry_window("loop0", index=5), batch_id=batch_id),
            headers=bearer(other_token),
        )
        assert response.status_code == 409

    def test_a_batch_id_resent_with_other_content_is_409(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        """It was 200 `accepted: false`, and the other content was dropped without a word."""
        _, token = node
        batch_id = uuid.uuid4()
        first = _batch(telemetry_window("loop0"), batch_id=batch_id)
        assert client.post(URL, json=first, headers=bearer(token)).status_code == 201
        # the same batch again, keys in another order: the same content
        again = {"windows": first["windows"], "batch_id": first["batch_id"]}
        resent = client.post(URL, json=again, headers=bearer(token))
        assert resent.status_code == 200, resent.text
        assert resent.json()["accepted"] is False
        other = _batch(telemetry_window("loop0", index=5), batch_id=batch_id)
        response = client.post(URL, json=other, headers=bearer(token))
        assert response.status_code == 409, response.text
        assert "other content" in response.json()["detail"]
        assert _stored(session) == 1

    def test_operator_token_cannot_ingest(self, client: TestClient, session: Session) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.post(URL, json=_batch(telemetry_window()), headers=bearer(admin))
        assert response.status_code == 403


class TestDeviceTelemetry:
    def test_lists_windows_newest_first(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        the_node, token = node
        windows = [telemetry_window("loop0", index=i) for i in range(5)]
        client.post(URL, json=_batch(*windows), headers=bearer(token))
        viewer = create_api_token(session, role=Role.VIEWER)
        device_id = client.get(
            "/api/v1/devices", params={"node_id": str(the_node.id)}, headers=bearer(viewer)
        ).json()[0]["id"]
        listed = client.get(
            f"/api/v1/devices/{device_id}/telemetry", params={"limit": 3}, headers=bearer(viewer)
        ).json()
        assert [w["window_start"] for w in listed] == sorted(
            (w["window_start"] for w in listed), reverse=True
        )
        assert len(listed) == 3
        assert listed[0]["mean_latency_us"] == 85.5


class TestTextInput:
    def test_nul_characters_are_refused_not_a_server_error(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        the_node, token = node
        response = client.put(
            f"/api/v1/nodes/{the_node.id}/inventory",
            json={"kernel_version": "6.1\u0000", "devices": []},
            headers=bearer(token),
        )
        assert response.status_code == 422
        assert "NUL" in response.json()["detail"]
        viewer = create_api_token(session, role=Role.VIEWER)
        query = client.get("/api/v1/audit", params={"actor": "a\u0000b"}, headers=bearer(viewer))
        assert query.status_code == 422
        # a batch is parsed from its bytes (bytes without a \u0000 escape skip the walk):
        # one NUL deep in one window still refuses it, naming where
        windows = [telemetry_window("loop0", index=i) for i in range(3)]
        windows[2]["latency_note"] = "no eBPF\u0000"
        refused = client.post(URL, json=_batch(*windows), headers=bearer(token))
        assert refused.status_code == 422
        assert "NUL" in refused.json()["detail"]
        assert _stored(session) == 0


class TestLatencyDistributions:
    def test_stored_with_their_percentiles(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        window = ebpf_window("loop0")
        response = client.post(URL, json=_batch(window), headers=bearer(token))
        assert response.status_code == 201, response.text
        row = session.scalars(select(TelemetryWindowRow)).one()
        assert row.latency_source == "ebpf"
        assert [o["op"] for o in row.operations or []] == ["read", "write"]
        assert row.p50_us is not None
        assert row.p99_us is not None
        assert row.p999_us is not None
        assert row.p50_us < row.p99_us <= row.p999_us
        assert row.p99_us > window["operations"][0]["p50_us"]

    def test_a_diskstats_window_has_no_percentiles(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        window = telemetry_window("loop0", latency_note="eBPF needs root")
        assert client.post(URL, json=_batch(window), headers=bearer(token)).status_code == 201
        row = session.scalars(select(TelemetryWindowRow)).one()
        assert (row.latency_source, row.latency_note) == ("diskstats", "eBPF needs root")
        assert (row.operations, row.p50_us, row.p99_us) == (None, None, None)

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            ({"count": 999}, "do not add up"),
            ({"device_ns": [[5000, 10], [4000, 990]]}, "increase strictly"),
            ({"p99_us": 1.0}, "must not decrease"),
            ({"size_bytes": [[12, 0], [13, 1000]]}, "greater than 0"),
        ],
    )
    def test_inconsistent_distributions_are_refused_whole(
        self,
        client: TestClient,
        session: Session,
        node: tuple[Node, str],
        change: dict[str, Any],
        message: str,
    ) -> None:
        _, token = node
        bad = ebpf_window("loop0", index=1)
        bad["operations"][0].update(change)
        batch = _batch(ebpf_window("loop0", index=0), bad)
        response = client.post(URL, json=batch, headers=bearer(token))
        assert response.status_code == 422
        assert message in response.text
        assert _stored(session) == 0  # the good window in the batch is not stored either

    def test_counts_must_match_diskstats(
        self, client: TestClient, session: Session, node: tuple[Node, str]
    ) -> None:
        _, token = node
        response = client.post(
            URL, json=_batch(ebpf_window("loop0", read_ios=5000)), headers=bearer(token)
        )
        assert response.status_code == 422
        assert "diskstats counts 5000" in response.text


def test_the_fleet_p99_histogram_counts_ebpf_windows(
    client: TestClient, session: Session, node: tuple[Node, str]
) -> None:
    _, token = node
    before = (
        metrics.WINDOW_P99._sum.get(),
        sum(b.get() for b in metrics.WINDOW_P99._buckets),
    )  # the sum of p99s seen, and how many
    batch = _batch(ebpf_window("loop0", index=0), telemetry_window("loop1", index=0))
    assert client.post(URL, json=batch, headers=bearer(token)).status_code == 201
    seen = sum(b.get() for b in metrics.WINDOW_P99._buckets) - before[1]
    assert seen == 1  # the eBPF window only
    assert metrics.WINDOW_P99._sum.get() > before[0]
    assert "blkpilot_fleet_window_p99_seconds_bucket" in client.get("/metrics").text


def test_hourly_rollups_are_read_through_the_api_and_the_device_page(
    client: TestClient, session: Session, node: tuple[Node, str]
) -> None:
    """The hours the upkeep rolls up (here in the test's transaction) are what the API's
    hourly telemetry and the device page's history show."""
    from service.telemetry import repository

    _, token = node
    windows = [ebpf_window("loop0", index=i) for i in range(6)]  # a minute from yesterday noon
    assert client.post(URL, json=_batch(*windows), headers=bearer(token)).status_code == 201
    start = datetime.fromisoformat(windows[0]["start"])
    assert repository.roll_up(session.connection(), start, start + timedelta(hours=1)).hours == 1
    viewer = create_api_token(session, role=Role.VIEWER)
    device = session.scalars(
        select(TelemetryWindowRow.device_id).where(TelemetryWindowRow.window_start == start)
    ).one()
    session.commit()
    hours = client.get(f"/api/v1/devices/{device}/telemetry/hourly", headers=bearer(viewer)).json()
    assert len(hours) == 1
    (hour,) = hours
    assert hour["windows"] == 6
    assert hour["iops"] == pytest.approx(6 * (1000 + 250) / 60)
    assert hour["mean_latency_us"] == pytest.approx(85.5)
    assert hour["max_p99_us"] == max(
        session.scalars(select(TelemetryWindowRow.p99_us)).all(), key=lambda v: v or 0
    )
    assert {o["op"] for o in hour["operations"]} == {"read", "write"}
    signed = client.post("/ui/login", data={"token": viewer}, follow_redirects=False)
    client.cookies.update(signed.cookies)
    page = client.get(f"/ui/devices/{device}")
    assert "Hourly history (rollups" in page.text
