"""Debian's kernel packages for the lab, chosen from the package index: the newest 6.1 version
for which the image, the headers and linux-source all exist (one ABI, one vermagic), fetched
with `apt-get download` and unpacked with `dpkg -x` — never installed into the host."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("BLKPILOT_LAB_CACHE", "/var/cache/blkpilot-lab"))


class LabSetupError(RuntimeError):
    pass


def _run(*argv: str, cwd: Path | None = None) -> str:
    result = subprocess.run(
        list(argv), capture_output=True, text=True, cwd=cwd, timeout=900, check=False
    )
    if result.returncode != 0:
        raise LabSetupError(f"{' '.join(argv)}: {result.stderr.strip()[-500:]}")
    return result.stdout


def versions(package: str) -> list[str]:
    out = _run("apt-cache", "madison", package)
    return [line.split("|")[1].strip() for line in out.splitlines() if line.count("|") >= 2]


@dataclass(frozen=True)
class KernelTrio:
    abi: str  # 6.1.0-56-amd64
    version: str  # 6.1.192-2

    @property
    def image(self) -> str:
        return f"linux-image-{self.abi}"

    @property
    def headers(self) -> list[str]:
        common = self.abi.removesuffix("-amd64") + "-common"
        return [f"linux-headers-{self.abi}", f"linux-headers-{common}", "linux-kbuild-6.1"]


def select_trio() -> KernelTrio:
    """The newest version with image, headers and source; refuses a mismatch loudly."""
    sources = set(versions("linux-source-6.1"))
    listing = _run("apt-cache", "search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64$")
    abis = sorted(
        {m.group(1) for m in re.finditer(r"^linux-image-(6\.1\.0-\d+-amd64) ", listing, re.M)},
        key=lambda abi: int(abi.split("-")[1]),
        reverse=True,
    )
    for abi in abis:
        for version in versions(f"linux-image-{abi}"):
            if version in sources and version in versions(f"linux-headers-{abi}"):
                return KernelTrio(abi, version)
    raise LabSetupError(
        "no Debian 6.1 version offers a matching image, headers and linux-source"
        f" (sources: {sorted(sources)}); run apt-get update"
    )


def fetch(trio: KernelTrio, cache: Path = DEFAULT_CACHE, *, with_build: bool = False) -> Path:
    """Unpacked packages under cache/<version>/root; downloaded once."""
    base = cache / trio.version
    root = base / "root"
    build = [*trio.headers, "linux-source-6.1"] if with_build else []
    wanted = [trio.image, *build]
    base.mkdir(parents=True, exist_ok=True)
    for package in wanted:
        marker = base / f".{package}.unpacked"
        if marker.exists():
            continue
        try:
            _run("apt-get", "download", f"{package}={trio.version}", cwd=base)
        except LabSetupError:
            _run("apt-get", "update")
            _run("apt-get", "download", f"{package}={trio.version}", cwd=base)
        (deb,) = base.glob(f"{package}_*.deb")
        _run("dpkg", "-x", str(deb), str(root))
        deb.unlink()
        marker.touch()
    return root


def vmlinuz(root: Path, trio: KernelTrio) -> Path:
    return root / "boot" / f"vmlinuz-{trio.abi}"


def modules_dir(root: Path, trio: KernelTrio) -> Path:
    return root / "lib" / "modules" / trio.abi
