"""Telemetry windows: what each device did between two collections, with the node's CPU,
context switches and power over the same interval."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import ValidationError

from agent.collectors.blklat import LatencySnapshot
from agent.collectors.cpu import CpuStat
from agent.collectors.diskstats import SECTOR, DiskStats
from agent.contract import histograms
from agent.contract.wire import (
    IoOperation,
    LatencySource,
    OperationLatency,
    PowerReading,
    PowerSource,
    TelemetryWindow,
)
from agent.power import PowerSample, WindowEnergy, primary, window_energy


@dataclass(frozen=True)
class Collection:
    at: float  # wall clock, seconds
    monotonic: float
    disks: dict[str, DiskStats]
    cpu: CpuStat | None = None
    power: list[PowerSample] = field(default_factory=list)
    latency: LatencySnapshot | None = None


def histogram_delta(before: dict[int, int], after: dict[int, int]) -> histograms.Sparse:
    """Counts added between two cumulative histograms (all of `after` if the map entry was
    re-created in between, which shows as a count going down)."""
    if after is before:  # the collector hands back an unchanged histogram as the same object
        return []
    if any(after.get(slot, 0) < count for slot, count in before.items()):
        before = {}
    return [(s, c - before.get(s, 0)) for s, c in sorted(after.items()) if c > before.get(s, 0)]


Deltas = dict[tuple[IoOperation, str, int], histograms.Sparse]


def deltas_by_device(before: LatencySnapshot, after: LatencySnapshot) -> dict[str, Deltas]:
    """Each device's (operation, kind, request-size slot) -> the latency histogram added in
    between, in one pass over the snapshot (a pass per device made a collection's cost grow
    with the square of the devices)."""
    found: dict[str, Deltas] = {}
    for key, counts in after.histograms.items():
        name, op, kind, size = key
        delta = histogram_delta(before.histograms.get(key, {}), counts)
        if delta:
            found.setdefault(name, {})[(op, kind, size)] = delta
    return found


def device_deltas(device: str, before: LatencySnapshot, after: LatencySnapshot) -> Deltas:
    """One device's (operation, kind, request-size slot) -> the latency histogram added in
    between."""
    found = {}
    for key, counts in after.histograms.items():
        name, op, kind, size = key
        if name != device:
            continue
        delta = histogram_delta(before.histograms.get(key, {}), counts)
        if delta:
            found[(op, kind, size)] = delta
    return found


def operations_between(
    device: str, before: LatencySnapshot, after: LatencySnapshot
) -> list[OperationLatency]:
    """Each operation's distributions over the window, for operations with completions."""
    return operations_of(device_deltas(device, before, after))


def operations_of(deltas: Deltas) -> list[OperationLatency]:
    """Each operation's distributions from a device's deltas, for operations with completions."""
    found = []
    for op in IoOperation:
        by_size = {
            size: h for (o, kind, size), h in deltas.items() if o is op and kind == "device_ns"
        }
        if not by_size:
            continue
        device_ns = histograms.merge(by_size.values())
        queue_ns = histograms.merge(
            h for (o, kind, _), h in deltas.items() if o is op and kind == "queue_ns"
        )
        sizes = sorted((size, sum(c for _, c in h)) for size, h in by_size.items())
        p = histograms.percentiles_us(device_ns)
        found.append(
            OperationLatency(
                op=op,
                count=sum(c for _, c in device_ns),
                device_ns=device_ns,
                queue_ns=queue_ns,
                size_bytes=sizes,
                p50_us=p["p50"],
                p95_us=p["p95"],
                p99_us=p["p99"],
                p999_us=p["p999"],
            )
        )
    return found


@dataclass(frozen=True)
class NodeWindow:
    cpu_utilisation: float | None
    context_switches_per_s: float | None
    energies: list[WindowEnergy]
    primary: WindowEnergy | None


def node_window(before: Collection, after: Collection) -> NodeWindow:
    seconds = after.monotonic - before.monotonic
    cpu = switches = None
    if before.cpu and after.cpu and seconds > 0:
        total = after.cpu.total_ticks - before.cpu.total_ticks
        if total > 0:
            cpu = min(1.0, max(0.0, (after.cpu.busy_ticks - before.cpu.busy_ticks) / total))
        delta = after.cpu.context_switches - before.cpu.context_switches
        switches = delta / seconds if delta >= 0 else None
    earlier = {sample.key: sample for sample in before.power}
    energies = [
        energy
        for sample in after.power
        if sample.key in earlier and (energy := window_energy(earlier[sample.key], sample))
    ]
    return NodeWindow(cpu, switches, energies, primary(energies))


def device_window(
    device: str,
    before: DiskStats,
    after: DiskStats,
    start: datetime,
    end: datetime,
    seconds: float,
    node: NodeWindow,
    latency: tuple[LatencySnapshot, LatencySnapshot] | None = None,
    deltas: Deltas | None = None,
) -> TelemetryWindow | None:
    """None when the counters went backwards (the device was re-created in between)."""
    reads, writes = after.reads - before.reads, after.writes - before.writes
    read_sectors = after.read_sectors - before.read_sectors
    write_sectors = after.write_sectors - before.write_sectors
    busy_ms = (after.read_ms - before.read_ms) + (after.write_ms - before.write_ms)
    io_ms, weighted_ms = after.io_ms - before.io_ms, after.weighted_ms - before.weighted_ms
    if min(reads, writes, read_sectors, write_sectors, busy_ms, io_ms, weighted_ms) < 0:
        return None
    ios = reads + writes
    total_bytes = (read_sectors + write_sectors) * SECTOR
    power = node.primary
    if latency is not None and not latency[0].unavailable and not latency[1].unavailable:
        source, note = LatencySource.EBPF, ""
        operations = (
            operations_of(deltas) if deltas is not None else operations_between(device, *latency)
        )
    else:
        source, operations = LatencySource.DISKSTATS, []
        note = (
            (latency[1].unavailable or latency[0].unavailable) if latency else "no eBPF collector"
        )
    return TelemetryWindow(
        device=device,
        start=start,
        end=end,
        read_ios=reads,
        write_ios=writes,
        read_bytes=read_sectors * SECTOR,
        write_bytes=write_sectors * SECTOR,
        iops=ios / seconds,
        read_share=reads / ios if ios else 0.0,
        mean_request_bytes=total_bytes / ios if ios else 0.0,
        mean_latency_us=busy_ms * 1000 / ios if ios else 0.0,
        queue_depth=weighted_ms / (seconds * 1000),
        utilisation=min(1.0, io_ms / (seconds * 1000)),
        cpu_utilisation=node.cpu_utilisation,
        context_switches_per_s=node.context_switches_per_s,
        power_watts=power.watts if power else None,
        energy_joules=power.joules if power else None,
        power_scope=power.scope if power else None,
        power_source=PowerSource(power.source) if power else None,
        power_readings=[
            PowerReading(
                source=PowerSource(e.source),
                zone=e.zone[:128],
                scope=e.scope,
                watts=e.watts,
                energy_joules=e.joules,
            )
            for e in node.energies
        ],
        latency_source=source,
        latency_note=note[:500],
        operations=operations,
    )


def windows(
    before: Collection, after: Collection, devices: set[str]
) -> tuple[NodeWindow, list[TelemetryWindow]]:
    """The node's window, and one window per device seen at both ends."""
    node = node_window(before, after)
    seconds = after.monotonic - before.monotonic
    start = datetime.fromtimestamp(before.at, UTC)
    end = datetime.fromtimestamp(after.at, UTC)
    if seconds <= 0 or end <= start:
        return node, []
    found = []
    latency = (before.latency, after.latency) if before.latency and after.latency else None
    by_device = (
        deltas_by_device(*latency)
        if latency is not None and not (latency[0].unavailable or latency[1].unavailable)
        else {}
    )
    for device in sorted(devices):
        if device in before.disks and device in after.disks:
            args = (device, before.disks[device], after.disks[device], start, end, seconds, node)
            try:
                window = device_window(*args, latency, by_device.get(device, {}))
            except ValidationError as error:
                if latency is None:
                    raise
                # distributions that disagree with diskstats: the window keeps its means, and
                # says why (a burst between the two reads), instead of stopping the agent
                reason = "; ".join(str(e["msg"]) for e in error.errors())[:400]
                note = f"eBPF not used for this window: {reason}"
                window = device_window(*args, (LatencySnapshot(unavailable=note),) * 2)
            if window is not None:
                found.append(window)
    return node, found
