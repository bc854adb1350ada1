"""A fixture host: sys/, proc/ and dev/ trees in the kernel's own file formats, for hardware
this machine lacks — an NVMe flash SSD with poll queues, a SATA HDD with a mounted partition,
an Optane P5800X, RAPL zones and an ACPI power meter. Layouts follow Linux 6.1 as Debian ships
it (symlinks from /sys/block into /sys/devices, values with trailing newlines)."""

from __future__ import annotations

from pathlib import Path

KERNEL = "6.1.0-18-amd64"

BFQ = {
    "back_seek_max": 16384,
    "back_seek_penalty": 2,
    "fifo_expire_async": 250,
    "fifo_expire_sync": 125,
    "low_latency": 1,
    "max_budget": 0,
    "slice_idle": 8,
    "slice_idle_us": 8000,
    "strict_guarantees": 0,
    "timeout_sync": 124,
}


def write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _queue(
    queue: Path,
    *,
    scheduler: str,
    rotational: int,
    nr_requests: int,
    io_poll: int = 0,
    tunables: dict[str, int] | None = None,
    logical: int = 512,
    physical: int = 512,
) -> None:
    write(queue / "scheduler", scheduler)
    write(queue / "rotational", rotational)
    write(queue / "nr_requests", nr_requests)
    write(queue / "read_ahead_kb", 128)
    write(queue / "io_poll", io_poll)
    write(queue / "io_poll_delay", -1)
    write(queue / "wbt_lat_usec", 75000 if rotational else 2000)
    write(queue / "logical_block_size", logical)
    write(queue / "physical_block_size", physical)
    for name, value in (tunables or {}).items():
        write(queue / "iosched" / name, value)


def _block(
    root: Path, name: str, device_dir: Path, *, dev: str, sectors: int, hw_queues: int
) -> Path:
    link(root / "sys" / "block" / name, device_dir)
    write(device_dir / "dev", dev)
    write(device_dir / "size", sectors)
    for index in range(hw_queues):
        (device_dir / "mq" / str(index)).mkdir(parents=True, exist_ok=True)
    return device_dir


def nvme_ssd(root: Path) -> None:
    controller = root / "sys/devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0"
    write(controller / "model", "Samsung SSD 980 PRO 1TB                 ")
    write(controller / "serial", "S5GXNF0R123456P     ")
    write(controller / "firmware_rev", "5B2QGXA7")
    write(controller / "transport", "pcie")
    disk = _block(
        root, "nvme0n1", controller / "nvme0n1", dev="259:0", sectors=1953525168, hw_queues=8
    )
    link(disk / "device", controller)
    write(disk / "wwid", "eui.002538b111b2a3c4")
    _queue(
        disk / "queue",
        scheduler="[none] mq-deadline kyber bfq",
        rotational=0,
        nr_requests=1023,
        io_poll=1,
    )
    write(root / "sys/module/nvme/parameters/poll_queues", 2)


def optane(root: Path) -> None:
    controller = root / "sys/devices/pci0000:80/0000:80:03.0/0000:81:00.0/nvme/nvme1"
    write(controller / "model", "INTEL SSDPF21Q400GB")
    write(controller / "serial", "PHAL1234005Z400BGN")
    write(controller / "transport", "pcie")
    disk = _block(
        root, "nvme1n1", controller / "nvme1n1", dev="259:2", sectors=781422768, hw_queues=8
    )
    link(disk / "device", controller)
    write(disk / "wwid", "eui.01000000000000005cd2e4a1b2c3d4e5")
    _queue(
        disk / "queue",
        scheduler="[none] mq-deadline kyber bfq",
        rotational=0,
        nr_requests=1023,
        io_poll=1,
        logical=512,
        physical=512,
    )


def sata_hdd(root: Path) -> None:
    scsi = root / "sys/devices/pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0"
    write(scsi / "model", "ST4000NM0035-1V4")
    write(scsi / "vendor", "ATA     ")
    write(scsi / "rev", "TN03")
    write(scsi / "wwid", "t10.ATA     ST4000NM0035-1V4107                      ZC18ABCD")
    disk = _block(root, "sda", scsi / "block" / "sda", dev="8:0", sectors=7814037168, hw_queues=1)
    link(disk / "device", scsi)
    _queue(
        disk / "queue",
        scheduler="mq-deadline kyber [bfq] none",
        rotational=1,
        nr_requests=64,
        tunables=BFQ,
        physical=4096,
    )
    write(disk / "sda1" / "partition", 1)
    write(disk / "sda1" / "dev", "8:1")
    (disk / "holders").mkdir()


def zram(root: Path) -> None:
    disk = root / "sys/devices/virtual/block/zram0"
    link(root / "sys/block/zram0", disk)
    write(disk / "dev", "252:0")
    write(disk / "size", 16777216)
    write(disk / "queue" / "rotational", 0)  # bio-based: no scheduler, no mq/


def power_sources(root: Path) -> None:
    powercap = root / "sys/devices/virtual/powercap/intel-rapl"
    zones = {
        "intel-rapl:0": ("package-0", 52_123_456_789),
        "intel-rapl:0/intel-rapl:0:0": ("core", 31_000_000_000),
        "intel-rapl:0/intel-rapl:0:1": ("dram", 7_654_321_000),
        "intel-rapl:1": ("package-1", 49_000_000_000),
    }
    for zone, (name, energy) in zones.items():
        write(powercap / zone / "name", name)
        write(powercap / zone / "energy_uj", energy)
        write(powercap / zone / "max_energy_range_uj", 262_143_328_850)
        write(powercap / zone / "enabled", 1)
        link(root / "sys/class/powercap" / Path(zone).name, powercap / zone)
    hwmon = root / "sys/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI000D:00/hwmon/hwmon2"
    write(hwmon / "name", "power_meter")
    write(hwmon / "power1_average", 245_000_000)  # µW
    write(hwmon / "power1_average_interval", 1000)
    write(hwmon / "power1_is_battery", 0)
    link(root / "sys/class/hwmon/hwmon2", hwmon)


def proc(root: Path) -> None:
    write(root / "proc/sys/kernel/osrelease", KERNEL)
    write(
        root / "proc/self/mountinfo",
        "22 1 8:1 / /data rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
    )
    write(root / "proc/swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority")


def build_fixture_host(root: Path) -> Path:
    for part in (nvme_ssd, optane, sata_hdd, zram, power_sources, proc):
        part(root)
    (root / "dev").mkdir(parents=True, exist_ok=True)
    return root
