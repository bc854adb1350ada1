"""Debian's kernel packages for the lab, chosen from the package index: the newest 6.1 version
for which the image, the headers and linux-source all exist (one ABI, one vermagic), fetched
with `apt-get download` and unpacked with `dpkg -x` — never installed into the host."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
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


KBUILD = "linux-kbuild-6.1"


@dataclass(frozen=True)
class KernelTrio:
    abi: str  # 6.1.0-56-amd64
    version: str  # 6.1.192-2
    # linux-kbuild-6.1's version: `version`, or — where the archive has moved it on and the
    # image has not followed yet — the newest of the same upstream release (a Debian revision
    # apart: the same host tools; the headers, not kbuild, make the modules' vermagic)
    kbuild_version: str = ""

    @property
    def image(self) -> str:
        return f"linux-image-{self.abi}"

    @property
    def headers(self) -> list[str]:
        common = self.abi.removesuffix("-amd64") + "-common"
        return [f"linux-headers-{self.abi}", f"linux-headers-{common}", KBUILD]

    def version_of(self, package: str) -> str:
        return self.kbuild_version or self.version if package == KBUILD else self.version


def kbuild_for(version: str, kbuilds: list[str]) -> str | None:
    """linux-kbuild-6.1's version to go with the kernel's: the same, else the newest listed
    (apt-cache madison lists newest first) of the same upstream release, else None."""
    if version in kbuilds:
        return version
    upstream = version.rsplit("-", 1)[0]
    return next((k for k in kbuilds if k.rsplit("-", 1)[0] == upstream), None)


def choose_trio(
    abis: list[str],
    versions_of: Callable[[str], list[str]],
    sources: list[str],
    kbuilds: list[str],
) -> KernelTrio | None:
    """The newest ABI (abis newest first) and version for which the archive offers the image,
    its headers, linux-source and a linux-kbuild-6.1 that goes with them (kbuild_for):
    everything `fetch` will download. versions_of: a package's versions (apt-cache madison)."""
    for abi in abis:
        headers = versions_of(f"linux-headers-{abi}")
        for version in versions_of(f"linux-image-{abi}"):
            if version not in sources or version not in headers:
                continue
            kbuild = kbuild_for(version, kbuilds)
            if kbuild is not None:
                return KernelTrio(abi, version, kbuild)
    return None


def select_trio() -> KernelTrio:
    """The newest version with image, headers, source and kbuild; refuses a mismatch loudly."""
    sources = versions("linux-source-6.1")
    kbuilds = versions(KBUILD)
    listing = _run("apt-cache", "search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64$")
    abis = sorted(
        {m.group(1) for m in re.finditer(r"^linux-image-(6\.1\.0-\d+-amd64) ", listing, re.M)},
        key=lambda abi: int(abi.split("-")[1]),
        reverse=True,
    )
    trio = choose_trio(abis, versions, sources, kbuilds)
    if trio is None:
        raise LabSetupError(
            "no Debian 6.1 version offers a matching image, headers, linux-source and"
            f" linux-kbuild-6.1 (sources: {sources}; kbuild: {kbuilds}); run apt-get update"
        )
    return trio


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
            _run("apt-get", "download", f"{package}={trio.version_of(package)}", cwd=base)
        except LabSetupError:
            _run("apt-get", "update")
            _run("apt-get", "download", f"{package}={trio.version_of(package)}", cwd=base)
        (deb,) = base.glob(f"{package}_*.deb")
        _run("dpkg", "-x", str(deb), str(root))
        deb.unlink()
        marker.touch()
    return root


def vmlinuz(root: Path, trio: KernelTrio) -> Path:
    return root / "boot" / f"vmlinuz-{trio.abi}"


def modules_dir(root: Path, trio: KernelTrio) -> Path:
    return root / "lib" / "modules" / trio.abi
