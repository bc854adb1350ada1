"""Ingest benchmark: concurrent agents post telemetry batches over loopback HTTP into PostgreSQL.

Starts `blkpilot serve` as its own process (embedded PostgreSQL unless --database-url is given),
enrolls one node per client with a real inventory, then each client posts pre-built batches of
--windows telemetry windows as fast as the service acknowledges them. Prints windows per second
and request latency percentiles, checks that every window was stored, and records the result
with the command that reproduces it in bench/results/ingest.json and ingest.md.

    python -m bench.ingest                       # defaults: 4 clients x 40 batches x 500 windows
    python -m bench.ingest --clients 8 --batches 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.record import provenance, record
from tests.factories import device_inventory
from tests.proc import BLKPILOT, clean_env, free_port, start_serve, stop, wait_ready

ROOT = Path(__file__).resolve().parent.parent

TARGET_WINDOWS_PER_SECOND = 10_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _window(device: str, index: int) -> dict[str, Any]:
    start = T0 + timedelta(seconds=10 * index)
    return {
        "device": device,
        "start": start.isoformat(),
        "end": (start + timedelta(seconds=10)).isoformat(),
        "read_ios": 12_000 + index % 97,
        "write_ios": 3_000 + index % 13,
        "read_bytes": 4096 * 12_000,
        "write_bytes": 4096 * 3_000,
        "iops": 1_500.0,
        "read_share": 0.8,
        "mean_request_bytes": 4096.0,
        "mean_latency_us": 81.25,
        "queue_depth": 1.7,
        "utilisation": 0.42,
        "power_watts": 17.5,
        "energy_joules": 175.0,
        "power_scope": "cpu_package",
    }


def build_batches(devices: list[str], batches: int, windows: int) -> list[bytes]:
    """Distinct (device, interval) pairs across all batches, as the agent would send them."""
    bodies = []
    for b in range(batches):
        rows = [
            _window(devices[i % len(devices)], b * windows + i // len(devices) * len(devices) + i)
            for i in range(windows)
        ]
        bodies.append(json.dumps({"batch_id": str(uuid.uuid4()), "windows": rows}).encode())
    return bodies


def enroll(base: str, admin: str, name: str, devices: list[str]) -> str:
    headers = {"Authorization": f"Bearer {admin}"}
    token = httpx.post(f"{base}/api/v1/enrollment-tokens", json={}, headers=headers).json()["token"]
    enrolled = httpx.post(
        f"{base}/api/v1/nodes", json={"enrollment_token": token, "hostname": name}
    ).json()
    node_token: str = enrolled["node_token"]
    inventory = {"devices": [device_inventory(d).model_dump(mode="json") for d in devices]}
    response = httpx.put(
        f"{base}/api/v1/nodes/{enrolled['node']['id']}/inventory",
        json=inventory,
        headers={"Authorization": f"Bearer {node_token}"},
    )
    response.raise_for_status()
    return node_token


async def client_run(base: str, token: str, bodies: list[bytes], latencies: list[float]) -> int:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    stored = 0
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:
        for body in bodies:
            started = time.perf_counter()
            response = await client.post("/api/v1/telemetry/batches", content=body)
            latencies.append(time.perf_counter() - started)
            if response.status_code != 201:
                raise RuntimeError(f"{response.status_code}: {response.text[:300]}")
            stored += response.json()["windows"]
    return stored


def ingested_total(base: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith("blkpilot_telemetry_windows_ingested_total "):
            return float(line.split()[1])
    return 0.0


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batches", type=int, default=40, help="batches per client")
    parser.add_argument("--windows", type=int, default=500, help="windows per batch")
    parser.add_argument("--devices", type=int, default=16, help="devices per node")
    parser.add_argument("--warmup", type=int, default=2, help="batches per client not timed")
    parser.add_argument("--database-url", default=None, help="default: embedded PostgreSQL")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/results")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="blkpilot-bench-"))
    extra = {"BLKPILOT_DATABASE_URL": args.database_url} if args.database_url else {}
    # the ingest path's capacity is measured, not the per-token rate limit in front of it
    extra["BLKPILOT_RATE_LIMIT"] = "1000000/second"
    env = clean_env(data_dir, **extra)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_serve(data_dir, env, port)
    try:
        wait_ready(f"{base}/readyz", server, timeout=90)
        admin = subprocess.run(
            [BLKPILOT, "token", "create", "--name", "bench", "--role", "admin"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        devices = [f"loop{i}" for i in range(args.devices)]
        tokens = [enroll(base, admin, f"bench-{c}", devices) for c in range(args.clients)]
        print(f"building {args.clients * (args.batches + args.warmup)} batches ...", flush=True)
        work = [build_batches(devices, args.batches + args.warmup, args.windows) for _ in tokens]

        async def phase(bodies: list[list[bytes]], latencies: list[float]) -> int:
            runs = [client_run(base, t, b, latencies) for t, b in zip(tokens, bodies, strict=True)]
            return sum(await asyncio.gather(*runs))

        asyncio.run(phase([w[: args.warmup] for w in work], []))
        before = ingested_total(base)
        latencies: list[float] = []
        started = time.perf_counter()
        stored = asyncio.run(phase([w[args.warmup :] for w in work], latencies))
        elapsed = time.perf_counter() - started
        counted = ingested_total(base) - before
    finally:
        stop(server)

    sent = args.clients * args.batches * args.windows
    assert stored == sent == counted, (stored, sent, counted)
    result = {
        "benchmark": "ingest",
        "windows_per_second": round(sent / elapsed),
        "target_windows_per_second": TARGET_WINDOWS_PER_SECOND,
        "p50_request_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99_request_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "windows": sent,
        "seconds": round(elapsed, 2),
        "clients": args.clients,
        "windows_per_batch": args.windows,
        "database": "external" if args.database_url else "embedded pgserver (PostgreSQL 16)",
        **provenance("ingest.py"),
    }
    print(json.dumps(result, indent=2))
    if not args.no_record:
        record(
            "ingest",
            result,
            {
                "windows/s": "windows_per_second",
                "p50 ms": "p50_request_ms",
                "p99 ms": "p99_request_ms",
                "clients": "clients",
            },
        )
    ok = result["windows_per_second"] >= TARGET_WINDOWS_PER_SECOND
    print(f"{'PASS' if ok else 'BELOW TARGET'}: {result['windows_per_second']:,} windows/s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
