"""The guest's initramfs: busybox, the kernel's own modules the scenario needs, fio with every
library it links, and the scenario as /init's script."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /tmp /sys/kernel/config
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
echo BLKPILOT-LAB-BOOTED
sh /scenario.sh
echo BLKPILOT-DMESG-BEGIN
dmesg
echo BLKPILOT-DMESG-END
echo BLKPILOT-LAB-DONE
poweroff -f
"""


def _libraries(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            found.append(Path(path))
    return found


def build(
    out: Path,
    *,
    modules: list[Path],
    scenario: str,
    files: dict[str, str] | None = None,
    binaries: tuple[str, ...] = ("fio",),
) -> Path:
    """Write out (gzip'd newc cpio) and return it."""
    stage = out.parent / (out.name + ".d")
    shutil.rmtree(stage, ignore_errors=True)
    for directory in ("bin", "lib/modules", "proc", "sys", "dev", "tmp", "etc"):
        (stage / directory).mkdir(parents=True, exist_ok=True)
    busybox = shutil.which("busybox")
    if busybox is None:
        raise FileNotFoundError("busybox (Debian package busybox-static)")
    shutil.copy2(busybox, stage / "bin" / "busybox")
    for name in binaries:
        binary = shutil.which(name)
        if binary is None:
            raise FileNotFoundError(name)
        shutil.copy2(binary, stage / "bin" / name)
        for library in _libraries(Path(binary)):
            target = stage / library.relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(library, target)
    for module in modules:
        shutil.copy2(module, stage / "lib" / "modules" / module.name)
    (stage / "init").write_text(INIT)
    (stage / "init").chmod(0o755)
    (stage / "scenario.sh").write_text(scenario)
    for name, text in (files or {}).items():
        path = stage / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    listing = subprocess.run(
        ["find", "."], cwd=stage, capture_output=True, text=True, check=True
    ).stdout
    archive = subprocess.run(
        ["cpio", "-o", "-H", "newc", "--quiet"],
        cwd=stage,
        input=listing.encode(),
        capture_output=True,
        check=True,
    ).stdout
    gz = subprocess.run(["gzip", "-1"], input=archive, capture_output=True, check=True).stdout
    out.write_bytes(gz)
    shutil.rmtree(stage)
    return out
