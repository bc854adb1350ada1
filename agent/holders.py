"""Does a block device hold data? Partitions, holders (dm, md), mounts, swap and filesystem
or partition-table signatures. When in doubt the answer is yes: nothing writes to it."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from agent.effects import Effects
from agent.host import HostPaths, read_text


@dataclass(frozen=True)
class DataCheck:
    holds_data: bool
    reasons: list[str]


def _partitions(paths: HostPaths, device: str) -> list[str]:
    base = paths.block / device
    try:
        return sorted(p.name for p in base.iterdir() if (p / "partition").exists())
    except OSError:
        return []


def _mounted_devnums(paths: HostPaths) -> dict[str, str]:
    """major:minor -> mount point, from mountinfo (which names devices by number)."""
    mounted: dict[str, str] = {}
    text = read_text(paths.proc / "self" / "mountinfo") or ""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            mounted.setdefault(fields[2], fields[4])
    return mounted


def _swaps(paths: HostPaths) -> set[str]:
    text = read_text(paths.proc / "swaps") or ""
    return {Path(line.split()[0]).name for line in text.splitlines()[1:] if line.split()}


def parse_blkid_export(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _signature(paths: HostPaths, device: str, effects: Effects) -> tuple[bool | None, str]:
    """What `blkid -p` (low-level probe, no cache) finds: (True, what), (False, ''), or
    (None, why it could not look)."""
    node = paths.dev / device
    blkid = shutil.which("blkid")
    if blkid is None:
        return None, "blkid is not installed"
    if not node.exists():
        return None, f"no device node {node}"
    result = effects.run(blkid, "-p", "-o", "export", str(node))
    if result.returncode == 2 and not result.stderr.strip():  # probed, nothing found
        return False, ""
    if result.returncode != 0:  # could not read it (blkid also exits 2 on errors)
        return None, result.stderr.strip().splitlines()[
            -1
        ] if result.stderr.strip() else "blkid failed"
    found = parse_blkid_export(result.stdout)
    if "TYPE" in found:
        return True, f"filesystem signature {found['TYPE']}"
    if "PTTYPE" in found:
        return True, f"partition table {found['PTTYPE']}"
    return True, "signature found: " + ", ".join(f"{k}={v}" for k, v in sorted(found.items()))


def check(paths: HostPaths, device: str, effects: Effects) -> DataCheck:
    reasons: list[str] = []
    partitions = _partitions(paths, device)
    if partitions:
        reasons.append(f"partitions: {', '.join(partitions)}")
    for name in [device, *partitions]:
        holders_dir = paths.block / device / (name if name != device else "") / "holders"
        try:
            holders = sorted(h.name for h in holders_dir.iterdir())
        except OSError:
            holders = []
        if holders:
            reasons.append(f"{name} is held by {', '.join(holders)}")
    mounted = _mounted_devnums(paths)
    for name in [device, *partitions]:
        sub = paths.block / device / (name if name != device else "")
        devnum = read_text(sub / "dev")
        if devnum and devnum in mounted:
            reasons.append(f"{name} is mounted on {mounted[devnum]}")
    swapping = _swaps(paths) & {device, *partitions}
    if swapping:
        reasons.append(f"swap on {', '.join(sorted(swapping))}")
    found, what = _signature(paths, device, effects)
    if found is None:
        reasons.append(f"assumed: could not probe for signatures ({what})")
    elif found:
        reasons.append(what)
    return DataCheck(bool(reasons), reasons)
