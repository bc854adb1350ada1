"""Device classes from sysfs facts, model strings and an optional measured probe.

Every decision carries its evidence, so an operator can see why a device is in its class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.contract.wire import DeviceClass, Transport

# Ultra-low-latency drives by model string: 3D XPoint (Optane) and low-latency NAND.
ULL_MODELS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Optane", re.compile(r"optane", re.I)),
    ("Optane P5800X", re.compile(r"P5800X|SSDPF2[1S]Q", re.I)),
    ("Optane P4800X/P4801X", re.compile(r"P480[01]X|SSDPE(21|D1)K|SSDPEL1K", re.I)),
    ("Optane 900P/905P", re.compile(r"\b90[05]P\b|SSDPE(21|D1)D", re.I)),
    ("Optane P1600X", re.compile(r"P1600X|SSDPEK1A", re.I)),
    ("Samsung Z-SSD", re.compile(r"Z-?SSD|SZ98[35]|MZ(PZ|WZ)", re.I)),
    ("Kioxia XL-FLASH", re.compile(r"XL-?FLASH|FL6", re.I)),
)

ULL_THRESHOLD_US = 10.0  # HotStorage '23: ULL means 4 KB QD1 read median under 10 µs

VIRTUAL_TRANSPORTS = {Transport.LOOP, Transport.VIRTIO, Transport.NULL_BLK}


@dataclass(frozen=True)
class Classification:
    device_class: DeviceClass
    evidence: list[str]


def ull_model(model: str) -> str | None:
    for name, pattern in ULL_MODELS:
        if pattern.search(model):
            return name
    return None


def classify(
    *,
    transport: Transport,
    rotational: bool,
    model: str,
    probe_median_us: float | None = None,
) -> Classification:
    evidence: list[str] = [f"transport {transport.value}", f"rotational={int(rotational)}"]
    family = ull_model(model) if model else None
    if family is not None:
        evidence.append(f"model {model!r} is {family}")
        device_class = DeviceClass.ULL
    elif transport in VIRTUAL_TRANSPORTS:
        device_class = DeviceClass.VIRTUAL
    elif transport is Transport.NVME:
        device_class = DeviceClass.NVME_FLASH
    elif rotational and transport in (Transport.SATA, Transport.SCSI):
        device_class = DeviceClass.HDD
    elif transport in (Transport.SATA, Transport.SCSI):
        device_class = DeviceClass.SATA_SSD
    else:
        device_class = DeviceClass.UNKNOWN
    if probe_median_us is not None:
        verdict = "<" if probe_median_us < ULL_THRESHOLD_US else ">="
        evidence.append(
            f"probe: 4 KB QD1 random-read median {probe_median_us:.1f} µs {verdict}"
            f" {ULL_THRESHOLD_US:g} µs"
        )
        if probe_median_us < ULL_THRESHOLD_US and not rotational:
            device_class = DeviceClass.ULL
    evidence.append(f"class {device_class.value}")
    return Classification(device_class, evidence)
