"""Block devices with a request queue: identity, queue attributes, tunables, poll support,
whether they hold data, and their class."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from agent import holders
from agent.classify import classify
from agent.contract.tunables import Scheduler
from agent.contract.wire import (
    DeviceCapabilities,
    DeviceInventory,
    PollCapabilities,
    Transport,
    parse_kernel_version,
)
from agent.effects import Effects
from agent.host import HostPaths, read_int, read_text
from agent.owners import owners
from agent.probe import probe

KNOWN_SCHEDULERS = {s.value: s for s in Scheduler}


@dataclass(frozen=True)
class KernelFacts:
    release: str
    version: tuple[int, int]
    hz: int | None = None  # CONFIG_HZ, where the kernel's configuration can be read

    @property
    def hybrid_polling(self) -> bool:
        return self.version < (6, 4)  # hybrid polling was removed in 6.4

    @property
    def io_poll_writable(self) -> bool:
        return self.version < (5, 16)  # since 5.16 writes to queue/io_poll are ignored

    @classmethod
    def of(cls, paths: HostPaths) -> KernelFacts:
        release = paths.kernel_release()
        return cls(release, parse_kernel_version(release), kernel_hz(paths, release))


def kernel_hz(paths: HostPaths, release: str) -> int | None:
    """CONFIG_HZ from /proc/config.gz (CONFIG_IKCONFIG_PROC) or /boot/config-<release>."""
    return _config_hz(paths.proc, release)


@functools.lru_cache(maxsize=8)
def _config_hz(proc: Path, release: str) -> int | None:
    """Read once per process: every Applier asks, and the configuration is ~200 kB."""
    import gzip

    for path, opener in (
        (proc / "config.gz", gzip.open),
        (proc.parent / "boot" / f"config-{release}", open),
    ):
        try:
            with opener(path, "rt") as config:
                for line in config:
                    if line.startswith("CONFIG_HZ="):
                        return int(line.split("=", 1)[1])
        except (OSError, ValueError, EOFError):
            continue
    return None


@dataclass(frozen=True)
class DiscoveredDevice:
    inventory: DeviceInventory
    devnum: str  # major:minor
    sys_path: Path  # resolved /sys/devices/... path
    backing_file: str | None = None  # loop devices
    unknown_schedulers: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inventory.name


@dataclass(frozen=True)
class Discovery:
    kernel: KernelFacts
    devices: list[DiscoveredDevice]
    skipped: dict[str, str]


def parse_scheduler(text: str) -> tuple[list[str], str | None]:
    """'none [mq-deadline] kyber' -> (['none', 'mq-deadline', 'kyber'], 'mq-deadline')."""
    names, current = [], None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            word = word[1:-1]
            current = word
        names.append(word)
    return names, current


def transport_of(name: str, sys_path: Path, paths: HostPaths) -> Transport:
    where = str(sys_path)
    if name.startswith("loop"):
        return Transport.LOOP
    if name.startswith("nullb"):
        return Transport.NULL_BLK
    if "/nvme/" in where or name.startswith("nvme"):
        return Transport.NVME
    if "/virtio" in where:
        return Transport.VIRTIO
    if re.search(r"/ata\d+/", where):
        return Transport.SATA
    if re.search(r"/host\d+/", where):
        return Transport.SCSI
    if "/mmc" in where:
        return Transport.MMC
    return Transport.OTHER


def _identity(paths: HostPaths, name: str, transport: Transport) -> tuple[str, str, str]:
    base = paths.block / name
    device = base / "device"
    model = read_text(device / "model") or ""
    serial = read_text(device / "serial") or read_text(base / "serial") or ""
    wwid = read_text(base / "wwid") or read_text(device / "wwid") or ""
    if transport is Transport.SCSI or transport is Transport.SATA:
        vendor = read_text(device / "vendor") or ""
        if vendor and vendor != "ATA" and not model.startswith(vendor):
            model = f"{vendor} {model}".strip()
    return model, serial, wwid


def queue_configuration(queue: Path) -> tuple[Scheduler | None, dict[str, int]]:
    """The scheduler a queue runs and that scheduler's tunables, as the inventory reports them."""
    _, current = parse_scheduler(read_text(queue / "scheduler") or "")
    return KNOWN_SCHEDULERS.get(current or ""), _tunables(queue)


def _tunables(queue: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        entries = sorted((queue / "iosched").iterdir())
    except OSError:
        return found
    for entry in entries:
        value = read_int(entry)
        if value is not None:
            found[entry.name] = value
    return found


def _poll_queues(paths: HostPaths, transport: Transport) -> int | None:
    module = {Transport.NVME: "nvme", Transport.NULL_BLK: "null_blk"}.get(transport)
    if module is None:
        return None
    return read_int(paths.sys / "module" / module / "parameters" / "poll_queues")


def describe(
    paths: HostPaths,
    name: str,
    kernel: KernelFacts,
    effects: Effects,
    *,
    with_probe: bool = False,
) -> DiscoveredDevice:
    base = paths.block / name
    queue = paths.queue(name)
    sys_path = Path(os.path.realpath(base))
    transport = transport_of(name, sys_path, paths)
    model, serial, wwid = _identity(paths, name, transport)
    listed, _ = parse_scheduler(read_text(queue / "scheduler") or "")
    current_scheduler, tunables = queue_configuration(queue)
    available = [KNOWN_SCHEDULERS[s] for s in listed if s in KNOWN_SCHEDULERS]
    unknown = [s for s in listed if s not in KNOWN_SCHEDULERS]
    rotational = read_int(queue / "rotational") == 1
    io_poll = read_int(queue / "io_poll")
    poll = PollCapabilities(
        io_poll=None if io_poll is None else io_poll == 1,
        io_poll_delay=read_int(queue / "io_poll_delay"),
        poll_queues=_poll_queues(paths, transport),
        hybrid_supported=kernel.hybrid_polling and io_poll == 1,
        io_poll_writes_honoured=kernel.io_poll_writable,
    )
    try:
        hw_queues = sum(1 for entry in (base / "mq").iterdir() if entry.is_dir())
    except OSError:
        hw_queues = 0
    capabilities = DeviceCapabilities(
        available_schedulers=available,
        current_scheduler=current_scheduler,
        scheduler_tunables=tunables,
        nr_requests=read_int(queue / "nr_requests"),
        read_ahead_kb=read_int(queue / "read_ahead_kb"),
        nr_hw_queues=hw_queues,
        logical_block_size=read_int(queue / "logical_block_size"),
        physical_block_size=read_int(queue / "physical_block_size"),
        wbt_lat_usec=read_int(queue / "wbt_lat_usec"),
        poll=poll,
        kernel_version=kernel.release,
    )
    data = holders.check(paths, name, effects)
    probe_median = None
    probe_note: list[str] = []
    if with_probe:
        try:
            result = probe(paths.dev / name)
            probe_median = result.median_us
            probe_note.append(f"probe: {result.reads} reads, p99 {result.p99_us:.1f} µs")
        except OSError as error:
            probe_note.append(f"probe failed: {error.strerror or error}")
    classification = classify(
        transport=transport, rotational=rotational, model=model, probe_median_us=probe_median
    )
    backing = read_text(base / "loop" / "backing_file") if transport is Transport.LOOP else None
    evidence = classification.evidence + probe_note
    if backing:
        evidence.insert(0, f"loop device backed by {backing}")
    if unknown:
        evidence.append(f"schedulers not known to blkpilot: {', '.join(unknown)}")
    inventory = DeviceInventory(
        name=name,
        model=model[:255],
        serial=serial[:255],
        wwid=wwid[:255],
        transport=transport,
        device_class=classification.device_class,
        class_evidence=[e[:255] for e in evidence][:32],
        rotational=rotational,
        size_bytes=(read_int(base / "size") or 0) * 512,
        holds_data=data.holds_data,
        holds_data_reasons=[r[:255] for r in data.reasons][:32],
        capabilities=capabilities,
        owners=owners(paths, name)[:16],
    )
    return DiscoveredDevice(
        inventory=inventory,
        devnum=read_text(base / "dev") or "",
        sys_path=sys_path,
        backing_file=backing,
        unknown_schedulers=unknown,
    )


def has_request_queue(paths: HostPaths, name: str) -> bool:
    """blk-mq devices have mq/ and a scheduler file; bio-based ones (zram, md, dm) do not."""
    return (paths.block / name / "mq").is_dir() and (paths.queue(name) / "scheduler").exists()


def is_attached(paths: HostPaths, name: str) -> bool:
    """An unattached loop device (size 0) is not a device anyone uses."""
    return (read_int(paths.block / name / "size") or 0) > 0


def discover(
    paths: HostPaths,
    effects: Effects | None = None,
    *,
    with_probe: bool = False,
    only: set[str] | None = None,
) -> Discovery:
    effects = effects or Effects()
    kernel = KernelFacts.of(paths)
    devices: list[DiscoveredDevice] = []
    skipped: dict[str, str] = {}
    try:
        names = sorted(entry.name for entry in paths.block.iterdir())
    except OSError:
        names = []
    for name in names:
        if only is not None and name not in only:
            continue
        if not has_request_queue(paths, name):
            skipped[name] = "no blk-mq request queue (bio-based device)"
        elif not is_attached(paths, name):
            skipped[name] = "size 0 (nothing attached)"
        else:
            devices.append(describe(paths, name, kernel, effects, with_probe=with_probe))
    return Discovery(kernel, devices, skipped)
