"""Build the project's modules against Debian's headers for the lab kernel (unpacked in the
lab cache; the host's /usr/src is never used or touched) — with sparse checking each source as
it builds — and hold them to the kernel's coding style (checkpatch --strict, from the
linux-source tarball of the same version)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kernel.lab import packages

KERNEL_DIR = Path(__file__).resolve().parent.parent


class BuildError(RuntimeError):
    pass


def headers_dir(root: Path, trio: packages.KernelTrio) -> Path:
    """The headers tree, with its absolute /usr/src include pointed at the unpacked copy."""
    tree = root / "usr" / "src" / f"linux-headers-{trio.abi}"
    makefile = tree / "Makefile"
    text = makefile.read_text()
    if "include /usr/src/" in text:
        makefile.write_text(text.replace("include /usr/src/", f"include {root}/usr/src/"))
    return tree


def _from_source(root: Path, out: Path, what: str, command: list[str]) -> None:
    """Run `command` once to take `what` out of the lab's linux-source tarball into `out`
    (a marker there says it was done)."""
    tarball = root / "usr" / "src" / "linux-source-6.1.tar.xz"
    marker = out / ".extracted"
    if marker.exists():
        return
    if not tarball.exists():
        raise BuildError(f"{tarball} is missing: fetch the trio with with_build=True")
    out.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [*command, str(tarball)], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        raise BuildError(f"extracting {what} from {tarball} failed: {result.stderr}")
    marker.touch()


def block_headers(root: Path, trio: packages.KernelTrio) -> Path:
    """The block layer's private headers (block/*.h), taken from the linux-source tarball of
    the same version by kernel/fios/block-headers.sh — the script dkms runs on a real host."""
    out = root / "usr" / "src" / "fios-private"
    script = KERNEL_DIR / "fios" / "block-headers.sh"
    _from_source(root, out, "block headers", ["sh", str(script), str(out)])
    return out / "block"


# Extra make variables per module: what it needs beyond the headers package.
MAKE_VARS = {"fios": lambda root, trio: {"FIOS_BLOCK_HEADERS": str(block_headers(root, trio))}}


# the modules held to the kernel's style: each one's sources (checkpatch_findings)
MODULES = ("fios", "flashsim")
# What checkpatch.pl reads beside itself (--no-tree: no kernel tree around it).
CHECKPATCH_FILES = ("checkpatch.pl", "spelling.txt", "const_structs.checkpatch")


def build_module(
    name: str, root: Path, trio: packages.KernelTrio, out: Path, source: Path | None = None
) -> Path:
    """kernel/<name>/ built out of tree, every source checked by sparse on the way (C=1): a
    warning from the compiler or from sparse fails the build; returns the .ko."""
    if shutil.which("sparse") is None:
        raise BuildError("sparse is not installed (Debian's sparse; `make setup` installs it)")
    source = source or KERNEL_DIR / name
    work = out / name
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work, ignore=shutil.ignore_patterns("*.o", "*.ko", ".*"))
    extra = MAKE_VARS[name](root, trio) if name in MAKE_VARS else {}
    result = subprocess.run(
        [
            "make",
            "-C",
            str(headers_dir(root, trio)),
            f"M={work}",
            "C=1",
            "CHECK=sparse",
            "modules",
            *(f"{key}={value}" for key, value in extra.items()),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(
            f"building {name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "warning:" in line]
    if warnings:
        raise BuildError(
            f"building {name} gave warnings (treated as errors):\n" + "\n".join(warnings)
        )
    module = work / f"{name}.ko"
    magic = vermagic(module)
    if not magic.startswith(trio.abi + " "):
        raise BuildError(f"{module} has vermagic {magic!r}, not {trio.abi}")
    return module


def vermagic(module: Path) -> str:
    """The module's vermagic string, from its .modinfo section's NUL-separated entries."""
    for entry in module.read_bytes().split(b"\0"):
        if entry.startswith(b"vermagic="):
            return entry.removeprefix(b"vermagic=").decode()
    return ""


def checkpatch_script(root: Path) -> Path:
    """scripts/checkpatch.pl (and the lists it reads) from the lab's linux-source tarball,
    extracted once into the lab cache."""
    out = root / "usr" / "src" / "checkpatch"
    members = [f"linux-source-6.1/scripts/{name}" for name in CHECKPATCH_FILES]
    # tar's archive last, as _from_source appends it: -f takes the next word, so -f at the end
    command = ["tar", "-C", str(out), "--strip-components=2", "-xJ", *members, "-f"]
    _from_source(root, out, "checkpatch", command)
    return out / "checkpatch.pl"


def module_sources(name: str) -> list[Path]:
    return sorted((KERNEL_DIR / name).glob("*.[ch]"))


def checkpatch_findings(script: Path, sources: list[Path]) -> list[str]:
    """Every error, warning and check `checkpatch.pl --strict` reports for these files, one
    line each (file:line: LEVEL: message); an empty list is clean."""
    findings = []
    for path in sources:
        result = subprocess.run(
            ["perl", str(script), "--no-tree", "--strict", "--terse", "--file", str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        found = [line for line in result.stdout.splitlines() if line.startswith(f"{path}:")]
        # status 0 and nothing said (--terse is silent on a clean file), or 1 with findings
        if result.returncode != int(bool(found)) or result.stderr.strip():
            raise BuildError(
                f"checkpatch did not run on {path} (status {result.returncode}):"
                f" {(result.stderr or result.stdout)[-500:]}"
            )
        findings += found
    return findings
