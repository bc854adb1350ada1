from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.contract.tunables import Scheduler
from agent.contract.wire import DeviceClass, Transport
from agent.discovery import discover, parse_scheduler
from agent.host import HostPaths
from tests.agent.conftest import LoopFactory


class TestOnThisMachine:
    def test_loop_devices_are_found_with_their_queue(self, loop_device: LoopFactory) -> None:
        name = loop_device(on="tmpfs")
        found = discover(HostPaths(), only={name})
        (device,) = found.devices
        inventory = device.inventory
        assert inventory.transport is Transport.LOOP
        assert inventory.device_class is DeviceClass.VIRTUAL
        assert inventory.size_bytes == 64 << 20
        assert device.backing_file is not None
        assert device.backing_file.startswith("/dev/shm/")
        capabilities = inventory.capabilities
        assert set(capabilities.available_schedulers) == {
            Scheduler.NONE,
            Scheduler.MQ_DEADLINE,
            Scheduler.KYBER,
            Scheduler.BFQ,
        }
        assert capabilities.current_scheduler is Scheduler.NONE
        assert capabilities.nr_hw_queues == 1
        assert capabilities.poll.io_poll is False
        assert capabilities.kernel_version == found.kernel.release
        # an empty file holds nothing: blkid finds no signature, nothing mounts it
        assert inventory.holds_data is False, inventory.holds_data_reasons

    def test_tunables_of_the_current_scheduler(self, loop_device: LoopFactory) -> None:
        name = loop_device()
        Path(f"/sys/block/{name}/queue/scheduler").write_text("bfq")
        (device,) = discover(HostPaths(), only={name}).devices
        tunables = device.inventory.capabilities.scheduler_tunables
        assert device.inventory.capabilities.current_scheduler is Scheduler.BFQ
        assert tunables["slice_idle_us"] == int(
            Path(f"/sys/block/{name}/queue/iosched/slice_idle_us").read_text()
        )
        assert "low_latency" in tunables

    def test_a_filesystem_means_the_device_holds_data(self, loop_device: LoopFactory) -> None:
        name = loop_device(on="disk")
        subprocess.run(["mkfs.ext4", "-q", "-F", f"/dev/{name}"], check=True)
        (device,) = discover(HostPaths(), only={name}).devices
        assert device.inventory.holds_data is True
        assert "filesystem signature ext4" in device.inventory.holds_data_reasons

    def test_the_machines_own_disk_holds_data(self) -> None:
        (vda,) = discover(HostPaths(), only={"vda"}).devices
        assert vda.inventory.holds_data is True
        assert "vda is mounted on /" in vda.inventory.holds_data_reasons

    def test_bio_based_and_detached_devices_are_skipped(self) -> None:
        found = discover(HostPaths())
        if Path("/sys/block/zram0").exists():
            assert "bio-based" in found.skipped["zram0"]
        detached = [n for n, why in found.skipped.items() if why.startswith("size 0")]
        assert all(n.startswith("loop") for n in detached)

    def test_probe_measures_and_records_its_evidence(self, loop_device: LoopFactory) -> None:
        name = loop_device(on="tmpfs")
        (device,) = discover(HostPaths(), only={name}, with_probe=True).devices
        evidence = " | ".join(device.inventory.class_evidence)
        assert "probe: 4 KB QD1 random-read median" in evidence
        median = float(evidence.split("median ")[1].split(" ")[0])
        expected = DeviceClass.ULL if median < 10 else DeviceClass.VIRTUAL
        assert device.inventory.device_class is expected


class TestOnFixtureHardware:
    def test_nvme_flash_with_poll_queues(self, fixture_host: Path) -> None:
        found = discover(HostPaths.under(fixture_host))
        nvme = next(d.inventory for d in found.devices if d.name == "nvme0n1")
        assert found.kernel.version == (6, 1)
        assert nvme.transport is Transport.NVME
        assert nvme.device_class is DeviceClass.NVME_FLASH
        assert nvme.model == "Samsung SSD 980 PRO 1TB"
        assert nvme.serial == "S5GXNF0R123456P"
        assert nvme.wwid == "eui.002538b111b2a3c4"
        assert nvme.size_bytes == 1953525168 * 512
        assert nvme.capabilities.nr_hw_queues == 8
        poll = nvme.capabilities.poll
        assert (poll.io_poll, poll.poll_queues) == (True, 2)
        assert poll.hybrid_supported is True  # 6.1 < 6.4, and the queue polls
        assert poll.io_poll_writes_honoured is False  # 6.1 >= 5.16
        # no device node in the fixture to probe: assumed to hold data
        assert nvme.holds_data is True
        assert any(r.startswith("assumed") for r in nvme.holds_data_reasons)

    def test_an_empty_device_image_does_not_hold_data(self, fixture_host: Path) -> None:
        (fixture_host / "dev" / "nvme0n1").write_bytes(bytes(1 << 20))
        found = discover(HostPaths.under(fixture_host), only={"nvme0n1"})
        assert found.devices[0].inventory.holds_data is False

    def test_sata_hdd_with_a_mounted_partition(self, fixture_host: Path) -> None:
        found = discover(HostPaths.under(fixture_host), only={"sda"})
        sda = found.devices[0].inventory
        assert sda.transport is Transport.SATA
        assert sda.device_class is DeviceClass.HDD
        assert sda.model == "ST4000NM0035-1V4"
        assert sda.capabilities.current_scheduler is Scheduler.BFQ
        assert sda.capabilities.scheduler_tunables["slice_idle_us"] == 8000
        assert sda.holds_data is True
        assert "partitions: sda1" in sda.holds_data_reasons
        assert "sda1 is mounted on /data" in sda.holds_data_reasons
        assert sda.capabilities.poll.hybrid_supported is False  # io_poll 0

    def test_optane_is_ull_by_model(self, fixture_host: Path) -> None:
        found = discover(HostPaths.under(fixture_host), only={"nvme1n1"})
        optane = found.devices[0].inventory
        assert optane.device_class is DeviceClass.ULL
        assert "model 'INTEL SSDPF21Q400GB' is Optane P5800X" in optane.class_evidence

    def test_zram_is_skipped(self, fixture_host: Path) -> None:
        assert "zram0" in discover(HostPaths.under(fixture_host)).skipped


@pytest.mark.parametrize(
    ("text", "names", "current"),
    [
        ("none [mq-deadline] kyber bfq", ["none", "mq-deadline", "kyber", "bfq"], "mq-deadline"),
        ("[none] mq-deadline", ["none", "mq-deadline"], "none"),
        ("none", ["none"], None),
        ("", [], None),
    ],
)
def test_parse_scheduler(text: str, names: list[str], current: str | None) -> None:
    assert parse_scheduler(text) == (names, current)
