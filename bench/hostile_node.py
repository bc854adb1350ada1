"""The hostile probe's part for what one node can do to the others, and what a node's own
trouble does to it (issue 64): overlapping windows that would overflow every node's hourly
roll-up, bytes that are not UTF-8 on the lean push path, JSON in another charset, clients that
hang up mid-body, a clock ahead of the service's, an unreadable node.json, a spool on a full
disk, a canary's candidate left by kill -9, and two canaries from two state directories on one
device. Each with real processes: the probe's `serve`, `blkpilot agent …`, a tmpfs of 1 MiB."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.proc import BLKPILOT

if TYPE_CHECKING:
    from bench.hostile import Probe, Tally


def node_trouble(probe: Probe, tally: Tally) -> None:
    for part in (
        _overlaps,
        _undecodable,
        _disconnects,
        _clock_ahead,
        _unreadable_node_state,
        _full_spool,
        _canary_leftovers,
    ):
        part(probe, tally)


def _post(probe: Probe, body: bytes, content_type: str = "application/json") -> Any:
    return probe.call(
        "POST",
        "/telemetry/batches",
        probe.other_token,
        content=body,
        headers={"Content-Type": content_type},
    )


def _overlaps(probe: Probe, tally: Tally) -> None:
    """The hostile tester's 1 h windows 10 ms apart: the first is stored, the others are
    refused, and the upkeep rolls every node's hour up."""
    hour, apart = timedelta(hours=1), timedelta(milliseconds=10)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=6)  # clear of the rest

    def window(offset: timedelta) -> dict[str, Any]:
        begin = start + offset
        return probe.window(
            start=begin.isoformat(),
            end=(begin + hour).isoformat(),
            read_bytes=3 * 10**14,
            read_ios=10**9,
        )

    first = probe.call(
        "POST", "/telemetry/batches", probe.other_token, json=probe.batch(window(timedelta(0)))
    )
    tally.check("a 1 h window stored", first.status_code == 201)
    for index in range(1, 4 if probe.quick else 40):
        body = probe.batch(window(apart * index), window(apart * (index + 100)))
        response = probe.call("POST", "/telemetry/batches", probe.other_token, json=body)
        tally.refusal(f"overlapping 1 h windows (batch {index})", response.status_code)
    maintained = probe.cli("telemetry", "maintain", check=False)
    tally.check(
        "every node's hours roll up after overlapping windows",
        maintained.returncode == 0 and "could not be rolled up" not in maintained.stdout,
    )


def _undecodable(probe: Probe, tally: Tally) -> None:
    body = b'{"batch_id":"%s","windows":[{"device":"sd\xc3\x28"}]}' % str(uuid.uuid4()).encode()
    tally.refusal("bytes that are not UTF-8 (the lean path)", _post(probe, body).status_code)
    valid = json.dumps(probe.batch(probe.window(seconds_ago=9000))).encode()
    tally.refusal(
        "JSON declared latin-1",
        _post(probe, valid, "application/json; charset=latin-1").status_code,
    )


def _server_errors(probe: Probe) -> float:
    text = httpx.get(f"{probe.url}/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "blkpilot_http_requests_total" and sample.labels["status"][0] == "5"
    )


def _disconnects(probe: Probe, tally: Tally) -> None:
    """Clients that hang up while `POST /nodes` reads their body: no 500, no alert."""
    before = _server_errors(probe)
    port = int(probe.url.rsplit(":", 1)[1])
    for _ in range(3 if probe.quick else 20):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(
                b"POST /api/v1/nodes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"enrollment_token": "'
            )
        time.sleep(0.05)
    time.sleep(0.5)
    tally.check("clients hanging up mid-body are no server error", _server_errors(probe) == before)


def _clock_ahead(probe: Probe, tally: Tally) -> None:
    ahead = datetime.now(UTC) + timedelta(minutes=6)
    body = probe.batch(
        probe.window(start=(ahead - timedelta(seconds=10)).isoformat(), end=ahead.isoformat())
    )
    response = probe.call("POST", "/telemetry/batches", probe.other_token, json=body)
    tally.refusal("a window 6 min ahead", response.status_code)
    tally.check(
        "a window ahead is refused as clock_ahead (the agent holds it)",
        response.status_code == 422 and response.json().get("error") == "clock_ahead",
    )


def _unreadable_node_state(probe: Probe, tally: Tally) -> None:
    for what, content in [
        ("an empty node.json", ""),
        ("node.json {}", "{}"),
        ("a truncated node.json", '{"server_url": "http://127.0.0.1:1", "node_i'),
    ]:
        state = probe.base / f"node-{uuid.uuid4().hex[:6]}"
        state.mkdir()
        (state / "node.json").write_text(content)
        config = state / "agent.toml"
        config.write_text(f'devices = ["{probe.agent_device}"]\nmetrics_port = 0\nebpf = false\n')
        run = probe.cli(
            "agent", "run", "--state-dir", str(state), "--config", str(config), check=False
        )
        tally.check(
            f"{what}: exit 78 in one line, no traceback",
            run.returncode == 78
            and "Traceback" not in run.stderr
            and len(run.stderr.strip().splitlines()) == 1,
        )


def _full_spool(probe: Probe, tally: Tally) -> None:
    """An agent whose state is on a 1 MiB tmpfs filled to the last byte: no empty batch file,
    nothing counted as rejected, and its windows reach the service from memory."""
    device = probe.device()
    state = probe.base / "full"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(state)], check=True)
    agent = None
    try:
        token = probe.call("POST", "/enrollment-tokens", probe.admin, json={}).json()["token"]
        probe.cli(
            "agent", "enroll", "--server", probe.url, "--token", token,
            "--state-dir", str(state), "--hostname", "hostile-full",
        )  # fmt: skip
        config = probe.base / "full.toml"
        config.write_text(
            f'devices = ["{device}"]\ninterval_s = 0.5\npush_interval_s = 1.0\n'
            "metrics_port = 0\nebpf = false\n[power]\nrapl = false\nhwmon = false\nipmi = false\n"
        )
        _fill(state)
        agent = subprocess.Popen(
            [BLKPILOT, "agent", "run", "--state-dir", str(state), "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        until = time.monotonic() + (6 if probe.quick else 20)
        while time.monotonic() < until:
            subprocess.run(
                ["dd", f"if=/dev/{device}", "of=/dev/null", "bs=4k", "count=500", "iflag=direct"],
                check=False,
                capture_output=True,
            )
            time.sleep(0.2)
        empty = [p.name for p in (state / "spool").glob("*.json*") if p.stat().st_size == 0]
        tally.check("a full spool disk leaves no empty batch file", not empty)
        tally.check("nothing set aside as rejected", not (state / "spool" / "rejected").exists())
        node_id = json.loads((state / "node.json").read_text())["node_id"]
        devices = probe.call("GET", f"/nodes/{node_id}/devices", probe.admin).json()
        stored = sum(
            len(probe.call("GET", f"/devices/{d['id']}/telemetry", probe.admin).json())
            for d in devices
        )
        tally.check("its windows reach the service from memory", stored > 0, lost=True)
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=60)
        subprocess.run(["umount", "-l", str(state)], check=False)


def _fill(directory: Path) -> None:
    chunk = b"\0" * 65536
    with (directory / "ballast").open("wb", buffering=0) as ballast:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    ballast.write(chunk[:size])


def _canary_leftovers(probe: Probe, tally: Tally) -> None:
    """A canary killed mid-candidate, then another on the device; and two canaries from two
    state directories at once."""
    device = probe.device()
    scheduler = Path(f"/sys/block/{device}/queue/scheduler")

    def canary(state: str, rounds: int = 3) -> list[str]:
        return [
            BLKPILOT, "agent", "canary", device, "--mode", "synthetic", "--scheduler", "bfq",
            "--rounds", str(rounds), "--round-seconds", "0.5", "--no-report",
            "--state-dir", str(probe.base / state),
        ]  # fmt: skip

    killed = subprocess.Popen(
        canary("leftover"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while "[bfq]" not in scheduler.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    killed.kill()
    killed.wait()
    after = subprocess.run(canary("leftover"), capture_output=True, text=True, check=False)
    tally.check(
        "a canary after a killed one leaves the original",
        after.returncode in (0, 1, 3) and "[none]" in scheduler.read_text(),
        lost=True,
    )
    first = subprocess.Popen(
        canary("daemon", rounds=8), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while "[bfq]" not in scheduler.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    second = subprocess.run(canary("by-hand"), capture_output=True, text=True, check=False)
    first.wait(timeout=300)
    tally.check(
        "a second canary on the device waits, saying for whom", "waiting for" in second.stderr
    )
    tally.check("two canaries leave the original", "[none]" in scheduler.read_text(), lost=True)
