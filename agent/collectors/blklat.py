"""Per-I/O block latency from eBPF (agent/ebpf/blklat.bpf.c): per device, operation and request
size class, cumulative histograms of device time and queue time, read from the BPF map at each
collection. Where eBPF cannot run — no privilege, no BTF, no libbpf, a locked-down kernel,
a fixture /sys — the collector says why, and the windows carry diskstats means only."""

from __future__ import annotations

import array
import ctypes
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.collectors import register
from agent.config import AgentConfig
from agent.contract.histograms import LATENCY_SLOTS
from agent.contract.wire import IoOperation
from agent.ebpf.loader import BpfObject, BpfUnavailable, libbpf
from agent.effects import Effects
from agent.host import HostPaths

log = logging.getLogger(__name__)

DEFAULT_OBJECT = Path(__file__).resolve().parent.parent / "ebpf" / "blklat.bpf.o"
OPERATIONS = (
    IoOperation.READ,
    IoOperation.WRITE,
    IoOperation.FLUSH,
    IoOperation.DISCARD,
    IoOperation.OTHER,
)
KINDS = {0: "device_ns", 1: "queue_ns", 2: "total_ns"}  # the BPF program's kinds


class HistKey(ctypes.Structure):
    _fields_ = [
        ("dev", ctypes.c_uint32),
        ("op", ctypes.c_uint8),
        ("size", ctypes.c_uint8),
        ("pad", ctypes.c_uint16),
    ]


class Hist(ctypes.Structure):
    _fields_ = [
        ("slots", ctypes.c_uint64 * LATENCY_SLOTS),
        ("count", ctypes.c_uint64),
        ("sum", ctypes.c_uint64),
    ]


class Hists(ctypes.Structure):
    """A key's histograms, one per kind (the BPF program's `struct hists`)."""

    _fields_ = [("kind", Hist * len(KINDS))]


# (device, operation, kind, request-size slot) -> cumulative latency slot counts
Cumulative = dict[tuple[str, IoOperation, str, int], dict[int, int]]


@dataclass(frozen=True)
class LatencySnapshot:
    """What the collector saw at one collection: cumulative histograms, or why there are none."""

    histograms: Cumulative = field(default_factory=dict)
    unavailable: str = ""
    sums: dict[tuple[str, IoOperation, str, int], int] = field(default_factory=dict)  # ns


def ensure_tracefs(paths: HostPaths, effects: Effects) -> str:
    """Mount tracefs where it belongs if it is missing (tools that read tracepoints by name need
    it); an empty string, or what went wrong."""
    tracing = paths.sys / "kernel" / "tracing"
    if not tracing.is_dir() or os.path.ismount(tracing):
        return ""
    result = effects.run("mount", "-t", "tracefs", "nodev", str(tracing))
    return "" if result.returncode == 0 else f"cannot mount tracefs: {result.stderr.strip()}"


def device_numbers(paths: HostPaths) -> dict[int, str]:
    """MKDEV(major, minor) -> the kernel's name, from /sys/block/*/dev."""
    found = {}
    block = paths.sys / "block"
    for entry in block.iterdir() if block.is_dir() else ():
        try:
            major, minor = (entry / "dev").read_text().strip().split(":")
        except (OSError, ValueError):
            continue
        found[(int(major) << 20) | int(minor)] = entry.name
    return found


def why_unavailable(paths: HostPaths, object_path: Path = DEFAULT_OBJECT) -> str:
    """Why eBPF cannot trace here, checked without loading anything ("" when it can try):
    what `agent status` says, and the collector's first checks."""
    if paths.sys != Path("/sys"):
        return f"eBPF traces this kernel, but the agent reads {paths.sys}"
    if os.geteuid() != 0:
        return "eBPF needs root (or CAP_BPF and CAP_PERFMON)"
    if not (paths.sys / "kernel" / "btf" / "vmlinux").exists():
        return "the kernel has no BTF (/sys/kernel/btf/vmlinux)"
    if not object_path.exists():
        return f"{object_path} is missing (the wheel carries it; in a checkout, `make` builds it)"
    try:
        libbpf()
    except BpfUnavailable as error:
        return str(error)
    return ""


class BlkLatCollector:
    name = "blklat"

    def __init__(
        self,
        paths: HostPaths,
        object_path: Path = DEFAULT_OBJECT,
        effects: Effects | None = None,
        *,
        devices: Iterable[str] | None = None,
    ) -> None:
        """`devices`: only these devices' histograms are read (the programs trace every
        device; reading the others' would cost the agent for nothing). Default: all."""
        self.paths = paths
        self.devices = frozenset(devices) if devices is not None else None
        self.unavailable = ""
        self._bpf: BpfObject | None = None
        self._names: dict[int, str] = {}
        self._decoded: dict[tuple[str, IoOperation, str, int], tuple[int, dict[int, int]]] = {}
        self.unavailable = why_unavailable(paths, object_path)
        if self.unavailable:
            log.warning("per-I/O latency unavailable: %s", self.unavailable)
            return
        mounted = ensure_tracefs(paths, effects or Effects())
        if mounted:
            log.warning("%s", mounted)
        try:
            self._bpf = BpfObject(object_path)
            self._fd = self._bpf.map_fd("hists")
            self._displaced_fd = self._bpf.map_fd("displaced")
        except BpfUnavailable as error:
            self.unavailable = str(error)
            self._bpf = None
        if self.unavailable:
            log.warning("per-I/O latency unavailable: %s", self.unavailable)

    @property
    def available(self) -> bool:
        return self._bpf is not None

    def collect(self, now: float) -> LatencySnapshot:
        if self._bpf is None:
            return LatencySnapshot(unavailable=self.unavailable)
        found: Cumulative = {}
        sums = {}
        for key, value in self._bpf.items(self._fd, HistKey, Hists, self._wanted):
            assert isinstance(key, HistKey)
            assert isinstance(value, Hists)
            name = self._names[key.dev]
            operation = OPERATIONS[min(key.op, 4)]
            for number, kind in KINDS.items():
                hist = value.kind[number]
                count = int(hist.count)
                if not count:
                    continue  # queue time of a device without a scheduler: never recorded
                where = (name, operation, kind, key.size)
                seen = self._decoded.get(where)
                if seen is None or seen[0] != count:
                    # decoding 320 slots is most of the collector's cost; a histogram whose
                    # count has not moved since the last collection has not changed
                    slots = array.array("Q", bytes(hist.slots))
                    seen = (count, {slot: n for slot, n in enumerate(slots) if n})
                    self._decoded[where] = seen
                found[where] = seen[1]
                sums[where] = int(hist.sum)
        for gone in self._decoded.keys() - found.keys():
            del self._decoded[gone]
        return LatencySnapshot(found, sums=sums)

    def untimed(self) -> int:
        """Requests the programs could not time since they were loaded: another request in
        flight at the same time held their slot of the request table (blklat.bpf.c)."""
        if self._bpf is None:
            return 0
        key, value = ctypes.c_uint32(0), ctypes.c_uint64(0)
        found = self._bpf.lib.bpf_map_lookup_elem(
            self._displaced_fd, ctypes.byref(key), ctypes.byref(value)
        )
        if found != 0:
            return 0
        return int(value.value)

    def _wanted(self, key: ctypes.Structure) -> bool:
        assert isinstance(key, HistKey)
        name = self._names.get(key.dev)
        if name is None:
            self._names = device_numbers(self.paths)
            name = self._names.get(key.dev)
            if name is None:
                return False  # a device that went away
        return self.devices is None or name in self.devices

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.close()
            self._bpf = None


@register("blklat")
def _from_config(config: AgentConfig) -> BlkLatCollector | None:
    if not config.ebpf:
        return None
    return BlkLatCollector(
        config.paths, config.ebpf_object or DEFAULT_OBJECT, devices=config.devices
    )
