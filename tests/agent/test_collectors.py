from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from agent.collectors import CollectorSet, collectors_for, register
from agent.collectors.cpu import (
    CpuCollector,
    CpuStat,
    cpu_pressure_us,
    parse_cpu_pressure,
    parse_stat,
)
from agent.collectors.diskstats import DiskStats, DiskstatsCollector, parse_diskstats
from agent.collectors.hwmon import HwmonCollector
from agent.collectors.ipmi import IpmiCollector, parse_dcmi_power
from agent.collectors.meter import MeterCollector
from agent.collectors.rapl import RaplCollector, unwrap
from agent.collectors.redfish import RedfishCollector
from agent.config import AgentConfig, PowerConfig
from agent.contract.wire import PowerScope
from agent.host import HostPaths
from agent.power import PowerSample
from agent.telemetry import Collection, windows

# Real output of `ipmitool dcmi power reading` (ipmitool 1.8.19, Dell iDRAC9).
DCMI_OUTPUT = """
    Instantaneous power reading:                   220 Watts
    Minimum during sampling period:                 38 Watts
    Maximum during sampling period:                412 Watts
    Average power reading over sample period:      201 Watts
    IPMI timestamp:                           Sat Nov 21 05:50:01 2026
    Sampling period:                          00000001 Seconds.
    Power reading state is:                   activated
"""

# The chassis power resource as in DMTF's public Redfish mockups.
REDFISH_POWER = {
    "@odata.id": "/redfish/v1/Chassis/1U/Power",
    "@odata.type": "#Power.v1_5_0.Power",
    "Id": "Power",
    "PowerControl": [
        {
            "@odata.id": "/redfish/v1/Chassis/1U/Power#/PowerControl/0",
            "MemberId": "0",
            "Name": "System Power Control",
            "PowerConsumedWatts": 344,
            "PowerCapacityWatts": 800,
            "PowerMetrics": {
                "IntervalInMin": 30,
                "MinConsumedWatts": 271,
                "AverageConsumedWatts": 325,
            },
        }
    ],
}

WALL = 1_790_000_000.0  # 2026-09: windows start after 2000 (agent.contract.base)


class TestDiskstats:
    def test_parses_this_machines_file(self) -> None:
        stats = parse_diskstats(Path("/proc/diskstats").read_text())
        assert "vda" in stats
        assert stats["vda"].reads > 0

    def test_kernel_formats_with_14_18_and_20_fields(self) -> None:
        base = "   8       0 sda 100 5 800 40 50 2 400 60 1 90 100"
        for extra in ("", " 0 0 0 0", " 0 0 0 0 7 3"):
            stats = parse_diskstats(base + extra)["sda"]
            assert (stats.reads, stats.read_sectors, stats.writes, stats.in_flight) == (
                100,
                800,
                50,
                1,
            )
            assert (stats.io_ms, stats.weighted_ms) == (90, 100)


class TestCpu:
    def test_parses_this_machines_stat(self) -> None:
        stat = parse_stat(Path("/proc/stat").read_text())
        assert stat.total_ticks > stat.busy_ticks > 0
        assert stat.context_switches > 0

    def test_cpu_pressure_is_the_some_lines_total(self, tmp_path: Path) -> None:
        text = (
            "some avg10=1.50 avg60=2.20 avg300=9.75 total=21869235276\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        )
        assert parse_cpu_pressure(text) == 21869235276
        assert parse_cpu_pressure("full avg10=0.00 total=7\n") is None
        assert cpu_pressure_us(HostPaths.under(tmp_path)) is None  # no PSI: no figure
        if Path("/proc/pressure/cpu").exists():  # this machine's, and it only grows
            first = cpu_pressure_us(HostPaths())
            assert first is not None
            assert first >= 0
            second = cpu_pressure_us(HostPaths())
            assert second is not None
            assert second >= first


def _disk(
    reads: int, writes: int, read_ms: int, write_ms: int, io_ms: int, weighted: int
) -> DiskStats:
    return DiskStats(reads, reads * 8, read_ms, writes, writes * 16, write_ms, 0, io_ms, weighted)


class TestWindows:
    def test_rates_shares_and_latency(self) -> None:
        before = Collection(WALL, 50.0, {"sdb": _disk(0, 0, 0, 0, 0, 0)}, CpuStat(100, 1000, 5000))
        after = Collection(
            WALL + 2, 52.0, {"sdb": _disk(3000, 1000, 60, 40, 1000, 3000)}, CpuStat(300, 1400, 9000)
        )
        _, (window,) = windows(before, after, {"sdb"})
        assert window.iops == 2000.0
        assert window.read_share == 0.75
        assert window.read_bytes == 3000 * 8 * 512
        assert window.mean_request_bytes == (3000 * 8 + 1000 * 16) * 512 / 4000
        assert window.mean_latency_us == 100 * 1000 / 4000  # 25 µs
        assert window.queue_depth == 1.5
        assert window.utilisation == 0.5
        assert window.cpu_utilisation == 0.5
        assert window.context_switches_per_s == 2000.0
        assert window.start == datetime.fromtimestamp(WALL, UTC)
        # no power source on this node: no number, not zero
        assert (window.power_watts, window.energy_joules, window.power_readings) == (None, None, [])

    def test_counters_going_backwards_skip_the_device(self) -> None:
        before = Collection(0.0, 0.0, {"loop0": _disk(500, 0, 5, 0, 5, 5)})
        after = Collection(1.0, 1.0, {"loop0": _disk(10, 0, 1, 0, 1, 1)})
        assert windows(before, after, {"loop0"})[1] == []

    def test_energy_prefers_the_system_meter_and_keeps_every_reading(self) -> None:
        disks = {"sdb": _disk(0, 0, 0, 0, 0, 0)}
        power_before = [
            PowerSample(
                "rapl", "intel-rapl:0/package-0", PowerScope.CPU_PACKAGE, 0.0, energy_joules=100.0
            ),
            PowerSample("ipmi", "dcmi", PowerScope.SYSTEM, 0.0, watts=200.0),
        ]
        power_after = [
            PowerSample(
                "rapl", "intel-rapl:0/package-0", PowerScope.CPU_PACKAGE, 10.0, energy_joules=450.0
            ),
            PowerSample("ipmi", "dcmi", PowerScope.SYSTEM, 10.0, watts=220.0),
        ]
        before = Collection(WALL, 0.0, disks, power=power_before)
        after = Collection(WALL + 10, 10.0, {"sdb": _disk(100, 0, 1, 0, 1, 1)}, power=power_after)
        _, (window,) = windows(before, after, {"sdb"})
        assert window.power_source == "ipmi"
        assert window.power_scope is PowerScope.SYSTEM
        assert window.energy_joules == pytest.approx(2100.0)  # mean of 200 W and 220 W x 10 s
        assert window.power_watts == pytest.approx(210.0)
        by_source = {r.source.value: r for r in window.power_readings}
        assert by_source["rapl"].energy_joules == pytest.approx(350.0)
        assert by_source["rapl"].watts == pytest.approx(35.0)


class TestRapl:
    def test_zones_scopes_and_wrap_around(self, fixture_host: Path) -> None:
        collector = RaplCollector(HostPaths.under(fixture_host))
        zones = {z.name: z.scope for z in collector.zones}
        assert zones == {
            "package-0": PowerScope.CPU_PACKAGE,
            "dram": PowerScope.DRAM,
            "package-1": PowerScope.CPU_PACKAGE,
        }  # core is inside package-0: not counted twice
        first = {s.zone: s.energy_joules for s in collector.collect(0.0)}
        assert set(first.values()) == {0.0}
        package0 = fixture_host / "sys/class/powercap/intel-rapl:0/energy_uj"
        max_range = 262_143_328_850
        package0.write_text(f"{max_range - 1_000_000}\n")  # 1 J before the wrap
        collector.collect(1.0)
        package0.write_text("4000000\n")  # wrapped, 4 J after it
        third = {s.zone: s.energy_joules for s in collector.collect(2.0)}
        consumed_first_step = (max_range - 1_000_000 - 52_123_456_789) / 1e6
        assert third["intel-rapl:0/package-0"] == pytest.approx(consumed_first_step + 5.0)

    def test_unwrap(self) -> None:
        assert unwrap(10, 25, 100) == 15
        assert unwrap(90, 5, 100) == 15

    def test_no_powercap_means_no_zones(self, tmp_path: Path) -> None:
        assert RaplCollector(HostPaths.under(tmp_path)).collect(0.0) == []


class TestHwmon:
    def test_acpi_power_meter_in_watts(self, fixture_host: Path) -> None:
        (sample,) = HwmonCollector(HostPaths.under(fixture_host)).collect(5.0)
        assert (sample.watts, sample.scope, sample.source) == (245.0, PowerScope.SYSTEM, "hwmon")


class TestIpmi:
    def test_parse(self) -> None:
        assert parse_dcmi_power(DCMI_OUTPUT) == 220.0
        assert parse_dcmi_power(DCMI_OUTPUT.replace("activated", "deactivated")) is None
        assert parse_dcmi_power("Error: DCMI not supported") is None

    def test_runs_the_command_at_most_every_interval(self, tmp_path: Path) -> None:
        calls = tmp_path / "calls"
        script = tmp_path / "ipmitool"
        script.write_text(f"#!/bin/sh\necho x >> {calls}\ncat <<'EOF'\n{DCMI_OUTPUT}\nEOF\n")
        script.chmod(0o755)
        collector = IpmiCollector([str(script)], min_interval=10)
        assert collector.collect(100.0)[0].watts == 220.0
        assert collector.collect(105.0)[0].at == 100.0  # cached
        collector.collect(111.0)
        assert calls.read_text().count("x") == 2

    def test_a_failing_bmc_is_an_error_not_a_number(self, tmp_path: Path) -> None:
        collector = IpmiCollector(["sh", "-c", "echo 'Could not open device' >&2; exit 1"])
        with pytest.raises(RuntimeError, match="Could not open device"):
            collector.collect(0.0)


@pytest.fixture
def bmc() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/redfish/v1/Chassis/1U/Power":
                self.send_error(404)
                return
            body = json.dumps(REDFISH_POWER).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class TestRedfish:
    def test_chassis_power(self, bmc: str) -> None:
        (sample,) = RedfishCollector(f"{bmc}/redfish/v1/Chassis/1U/Power").collect(1.0)
        assert (sample.watts, sample.scope, sample.zone) == (344.0, PowerScope.SYSTEM, "1U/Power")

    def test_wrong_url_fails_loudly(self, bmc: str) -> None:
        with pytest.raises(Exception, match="404"):
            RedfishCollector(f"{bmc}/redfish/v1/Chassis/9/Power").collect(1.0)


class TestMeter:
    def test_integrates_appended_samples(self, tmp_path: Path) -> None:
        log = tmp_path / "hobo.csv"
        log.write_text(
            "timestamp,watts\n2026-11-21T05:00:00+00:00,100\n2026-11-21T05:00:10+00:00,120\n2026-11-21T05:00"
        )
        meter = MeterCollector(log)
        (first,) = meter.collect(0.0)
        assert first.energy_joules == pytest.approx(1100.0)
        with log.open("a") as handle:  # the meter finishes its line and adds another
            handle.write(":20+00:00,140\n1700000000,garbage\n")
        (second,) = meter.collect(0.0)
        assert second.energy_joules == pytest.approx(1100.0 + 1300.0)
        assert second.watts == 140.0

    def test_empty_log_gives_no_reading(self, tmp_path: Path) -> None:
        log = tmp_path / "empty.csv"
        log.write_text("timestamp,watts\n")
        assert MeterCollector(log).collect(0.0) == []


class TestIsolation:
    def test_a_failing_collector_does_not_stop_the_others(self) -> None:
        class Broken:
            name = "broken"

            def collect(self, now: float) -> object:
                raise OSError("sensor vanished")

        collectors = CollectorSet(
            [Broken(), DiskstatsCollector(HostPaths()), CpuCollector(HostPaths())]
        )
        results = collectors.collect(0.0)
        assert set(results) == {"diskstats", "cpu"}
        assert collectors.status["broken"].ok is False
        assert "sensor vanished" in collectors.status["broken"].error
        assert collectors.status["diskstats"].ok is True


class TestRegistry:
    """The registry drives collection: what is present and not disabled, in a fixed order."""

    def config(self, host: Path, **options: object) -> AgentConfig:
        return AgentConfig(
            sys_root=host / "sys", proc_root=host / "proc", dev_root=host / "dev", **options
        )

    def test_every_present_collector_in_order(self, fixture_host: Path) -> None:
        names = [c.name for c in collectors_for(self.config(fixture_host))]
        # the fixture host has RAPL zones and an ACPI power meter, no IPMI device, no Redfish;
        # blklat is there, and says it cannot trace a fixture /sys; the CPU-time estimate is
        # always there (used only when nothing measured is: agent.power.primary)
        assert names == ["diskstats", "blklat", "cpu", "rapl", "hwmon", "estimate"]
        power = [c.name for c in collectors_for(self.config(fixture_host), power_only=True)]
        assert power == ["rapl", "hwmon", "estimate"]

    def test_disabled_and_switched_off_collectors_are_left_out(self, fixture_host: Path) -> None:
        config = self.config(
            fixture_host,
            disabled_collectors=["cpu"],
            power=PowerConfig(rapl=False, ipmi=False, estimate=False),
        )
        assert [c.name for c in collectors_for(config)] == ["diskstats", "blklat", "hwmon"]

    def test_an_unknown_disabled_collector_is_a_clear_error(self, fixture_host: Path) -> None:
        config = self.config(fixture_host, disabled_collectors=["diskstat"])
        with pytest.raises(ValueError, match="unknown collectors: diskstat"):
            collectors_for(config)

    def test_a_name_registers_once(self) -> None:
        with pytest.raises(ValueError, match="registered already"):
            register("diskstats")(lambda config: None)
