"""Small typed factories that build state through the services, as the API would."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.wire import (
    DeviceCapabilities,
    DeviceClass,
    DeviceInventory,
    EnrollRequest,
    InventoryReport,
    PollCapabilities,
    Transport,
)
from service.devices import repository as device_repository
from service.devices import service as device_service
from service.nodes import service as node_service
from service.security import Principal, Role
from service.tables import Device, ModelVersion, Node, RecommendationRow
from service.tokens import service as token_service

# yesterday's noon: inside the raw telemetry retention whenever the suite runs
T0 = (datetime.now(UTC) - timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create_api_token(session: Session, *, role: Role, name: str | None = None) -> str:
    _, secret = token_service.create_api_token(
        session,
        "tests",
        name=name or f"{role.value}-{id(session)}-{datetime.now().timestamp()}",
        role=role,
    )
    return secret


def create_enrollment_token(session: Session, *, labels: dict[str, str] | None = None) -> str:
    _, secret = token_service.create_enrollment_token(
        session, "tests", labels=labels or {}, ttl=timedelta(hours=1)
    )
    return secret


def create_node(
    session: Session, *, hostname: str = "node-a", labels: dict[str, str] | None = None
) -> tuple[Node, str]:
    enrolled, secret = node_service.enroll(
        session,
        EnrollRequest(
            enrollment_token=create_enrollment_token(session),
            hostname=hostname,
            labels=labels or {},
        ),
    )
    node = session.get(Node, enrolled.id)  # the ORM's, for tests that change it
    assert node is not None
    return node, secret


def device_inventory(
    name: str = "loop0",
    *,
    device_class: DeviceClass = DeviceClass.ULL,
    scheduler: Scheduler = Scheduler.NONE,
    holds_data: bool = False,
    poll_queues: int | None = None,
    hybrid: bool = False,
    **overrides: Any,
) -> DeviceInventory:
    return DeviceInventory(
        name=name,
        model=overrides.pop("model", ""),
        transport=overrides.pop("transport", Transport.LOOP),
        device_class=device_class,
        class_evidence=["test fixture"],
        rotational=overrides.pop("rotational", False),
        size_bytes=overrides.pop("size_bytes", 1 << 30),
        holds_data=holds_data,
        capabilities=DeviceCapabilities(
            available_schedulers=[
                Scheduler.NONE,
                Scheduler.MQ_DEADLINE,
                Scheduler.KYBER,
                Scheduler.BFQ,
            ],
            current_scheduler=scheduler,
            scheduler_tunables=overrides.pop("scheduler_tunables", {}),
            nr_requests=overrides.pop("nr_requests", 128),
            read_ahead_kb=overrides.pop("read_ahead_kb", 128),
            nr_hw_queues=1,
            poll=PollCapabilities(poll_queues=poll_queues, hybrid_supported=hybrid),
            kernel_version="6.1.0-18-amd64",
        ),
        **overrides,
    )


def report_inventory(session: Session, node: Node, *devices: DeviceInventory) -> list[Device]:
    device_service.replace_inventory(
        session,
        Principal(name=f"node:{node.hostname}", node_id=node.id),
        node.id,
        InventoryReport(kernel_version="6.1.0-18-amd64", devices=list(devices)),
    )
    return list(device_repository.for_node(session, node.id))


def telemetry_window(device: str = "loop0", *, index: int = 0, **overrides: Any) -> dict[str, Any]:
    start = T0 + timedelta(seconds=10 * index)
    window: dict[str, Any] = {
        "device": device,
        "start": start.isoformat(),
        "end": (start + timedelta(seconds=10)).isoformat(),
        "read_ios": 1000,
        "write_ios": 250,
        "read_bytes": 4096 * 1000,
        "write_bytes": 4096 * 250,
        "iops": 125.0,
        "read_share": 0.8,
        "mean_request_bytes": 4096.0,
        "mean_latency_us": 85.5,
        "queue_depth": 1.2,
        "utilisation": 0.4,
    }
    window.update(overrides)
    return window


def operation_latency(op: str, count: int, center_us: float) -> dict[str, Any]:
    """One operation's eBPF distributions: a spread around center_us, all 4 KiB requests."""
    from agent.contract import histograms

    spread = [(0.8, 0.25), (1.0, 0.5), (1.5, 0.2), (4.0, 0.05)]
    counts: dict[int, int] = {}
    for factor, share in spread:
        slot = histograms.latency_slot(center_us * factor * 1000)
        counts[slot] = counts.get(slot, 0) + round(count * share)
    counts[max(counts)] += count - sum(counts.values())
    device_ns = sorted(counts.items())
    p = histograms.percentiles_us(device_ns)
    return {
        "op": op,
        "count": count,
        "device_ns": device_ns,
        "size_bytes": [(12, count)],
        **{f"{name}_us": value for name, value in p.items()},
    }


def ebpf_window(device: str = "loop0", *, index: int = 0, **overrides: Any) -> dict[str, Any]:
    """A window as an agent with eBPF sends it: diskstats' counts and the distributions."""
    window = telemetry_window(device, index=index, latency_source="ebpf")
    window["operations"] = [
        operation_latency("read", window["read_ios"], 80.0),
        operation_latency("write", window["write_ios"], 120.0),
    ]
    window.update(overrides)
    return window


def rapl_window(
    device: str = "loop0", *, index: int = 0, zone: str = "package-0", **overrides: Any
) -> dict[str, Any]:
    """A window with a RAPL power reading whose numbers need every digit of a double (and a
    zone name as given: tests put escapes in it)."""
    window = telemetry_window(
        device,
        index=index,
        power_watts=17.123456789012345,
        energy_joules=1e-7,
        power_scope="cpu_package",
        power_source="rapl",
        power_readings=[
            {
                "source": "rapl",
                "zone": zone,
                "scope": "cpu_package",
                "watts": 17.123456789012345,
                "energy_joules": 1e-7,
            }
        ],
    )
    window.update(overrides)
    return window


def create_recommendation(
    session: Session,
    device_id: uuid.UUID,
    config: DeviceConfig,
    workload_name: str,
    evidence: dict[str, object] | None = None,
) -> RecommendationRow:
    """A proposed recommendation (p50 latency 40 → 30 µs predicted) as the nightly job stores
    one, made an hour ago."""
    version = ModelVersion(
        run_id=uuid.uuid4(), device_class="ull", objective="p50_latency", rows=10, cells=4
    )
    session.add(version)
    session.flush()
    row = RecommendationRow(
        device_id=device_id,
        model_version_id=version.id,
        objective="p50_latency",
        objectives=["p50_latency"],
        workload_name=workload_name,
        workload_basis="test",
        current_config={"scheduler": "none"},
        recommended_config=config.model_dump(mode="json", exclude_none=True),
        predictions={
            "p50_latency": {
                "metric": "lat_p50_us",
                "current": 40.0,
                "recommended": 30.0,
                "change": -0.25,
                "change_low": -0.4,
                "change_high": -0.1,
                "higher_is_better": False,
            }
        },
        confidence=0.6,
        evidence=evidence or {},
        reason="predicted faster",
        next_canary=None,
        expected_gain=0.25,
        status="proposed",
        created_at=datetime.now(UTC) - timedelta(hours=1),
    )
    session.add(row)
    session.flush()
    return row
