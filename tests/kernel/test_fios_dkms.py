"""The FIOS role (playbooks/fios.yml) for real: the real ansible-playbook installs the lab's
Debian 6.1 kernel headers and the matching linux-source with apt, and DKMS builds and installs
the module for that kernel on this host (whose own kernel is not a 6.1, so the module is built
for a kernel that is installed but not running, as for a node before its reboot). The module
DKMS built then boots in that kernel under QEMU, serves I/O as the queue's scheduler and
unloads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.bench import fio as fio_jobs
from kernel.lab import initramfs, packages, qemu
from kernel.lab.build import vermagic
from kernel.lab.scenarios import null_overhead_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
VERSION = "0.1.0"  # the role's blkpilot_fios_version, dkms.conf's PACKAGE_VERSION
SOURCE = Path(f"/usr/src/fios-{VERSION}")


def _forget() -> None:
    """No FIOS in DKMS's tree or /usr/src: the role starts from a node that never had it."""
    if shutil.which("dkms") is not None:
        known = subprocess.run(
            ["dkms", "status", f"fios/{VERSION}"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        if known.stdout.strip():
            subprocess.run(
                ["dkms", "remove", f"fios/{VERSION}", "--all"],
                capture_output=True,
                check=True,
                timeout=300,
            )
    shutil.rmtree(SOURCE, ignore_errors=True)


@pytest.fixture(scope="module")
def trio() -> Iterator[packages.KernelTrio]:
    _forget()
    yield packages.select_trio()
    _forget()


def _playbook(*extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            *extra,
            "fios.yml",
        ],
        cwd=PLAYBOOKS,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


def _recap(run: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = run.stdout.split("PLAY RECAP")[1].splitlines()[1]
    return {k: int(v) for k, v in (item.split("=") for item in line.split(":", 1)[1].split())}


@pytest.fixture(scope="module")
def installed(trio: packages.KernelTrio) -> Path:
    run = _playbook(
        "-e",
        f"blkpilot_fios_kernel={trio.abi}",
        "-e",
        f"blkpilot_fios_kernel_version={trio.version}",
        "-e",
        "blkpilot_fios_load=false",
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr
    assert _recap(run)["changed"] >= 3  # source copied, added, built and installed
    (module,) = Path(f"/lib/modules/{trio.abi}/updates/dkms").glob("fios.ko*")
    return module


def test_a_kernel_that_is_not_debian_6_1_is_refused_before_anything_changes(
    trio: packages.KernelTrio,
) -> None:
    running = os.uname().release
    assert not running.startswith("6.1.0-")  # this host's kernel; the lab's is the 6.1
    run = _playbook("-e", "blkpilot_fios_install_os_packages=false")
    assert run.returncode != 0
    assert f"FIOS builds for Debian 12's 6.1 kernels: {running} is not one" in run.stdout
    assert not SOURCE.exists()


def test_dkms_builds_and_installs_it_for_the_kernel(
    trio: packages.KernelTrio, installed: Path
) -> None:
    status = subprocess.run(
        ["dkms", "status", f"fios/{VERSION}", "-k", trio.abi],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert f"fios/{VERSION}, {trio.abi}, x86_64: installed" in status.stdout
    assert vermagic(installed).startswith(trio.abi + " ")
    # headers and source at one Debian version: block-headers.sh refuses a mismatch
    for package in (f"linux-headers-{trio.abi}", "linux-source-6.1"):
        version = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package],
            capture_output=True,
            text=True,
            check=True,
        )
        assert version.stdout == trio.version, package


def test_a_second_run_changes_nothing(trio: packages.KernelTrio, installed: Path) -> None:
    before = installed.stat().st_mtime_ns
    run = _playbook(
        "-e",
        f"blkpilot_fios_kernel={trio.abi}",
        "-e",
        f"blkpilot_fios_kernel_version={trio.version}",
        "-e",
        "blkpilot_fios_load=false",
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert _recap(run)["changed"] == 0
    assert installed.stat().st_mtime_ns == before


def test_the_module_dkms_built_serves_io_in_that_kernel(
    trio: packages.KernelTrio, installed: Path, tmp_path: Path
) -> None:
    root = packages.fetch(trio)
    base = packages.modules_dir(root, trio) / "kernel"
    stock = [next(base.rglob(f"{name}.ko")) for name in ("configfs", "null_blk")]
    guest_module = tmp_path / "fios.ko"  # the initramfs loads /lib/modules/fios.ko
    if installed.suffix == ".ko":
        shutil.copy2(installed, guest_module)
    else:  # compressed by dkms: the guest's busybox insmod takes the plain module
        subprocess.run(["xz", "-dc", str(installed)], stdout=guest_module.open("wb"), check=True)
    select = "echo fios > /sys/block/nullb0/queue/scheduler\n"
    script = null_overhead_script(rounds=1, seconds=0.5, schedulers=("none", "fios"))
    assert script.count(select) == 1
    script = script.replace(
        select, select + "echo SELECTED $(cat /sys/block/nullb0/queue/scheduler)\n"
    )
    initrd = initramfs.build(
        tmp_path / "dkms.initrd.gz", modules=[*stock, guest_module], scenario=script
    )
    booted = qemu.boot(packages.vmlinuz(root, trio), initrd, timeout=300)
    assert booted.kernel_problems() == []  # includes: fios unloaded again
    served = {}
    for label, body in booted.results.items():
        served[label] = fio_jobs.parse(json.loads(body[body.index("{") :]))
    assert set(served) == {"none/0", "fios/0"}
    assert served["fios/0"].metrics["read_iops"] > 0
    selected = [line for line in booted.console.splitlines() if line.startswith("SELECTED")]
    (line,) = selected  # the queue's scheduler after `echo fios`, as the guest read it back
    assert "[fios]" in line.split(), line
