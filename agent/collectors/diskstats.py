"""/proc/diskstats: per-device I/O counters (Documentation/admin-guide/iostats.rst)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.collectors import register
from agent.config import AgentConfig
from agent.host import HostPaths, read_text

SECTOR = 512


@dataclass(frozen=True)
class DiskStats:
    reads: int
    read_sectors: int
    read_ms: int
    writes: int
    write_sectors: int
    write_ms: int
    in_flight: int
    io_ms: int  # time the device had I/O in flight
    weighted_ms: int  # sum over I/Os of their time in flight (average queue depth x time)


def parse_diskstats(text: str) -> dict[str, DiskStats]:
    stats: dict[str, DiskStats] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 14:
            continue
        n = [int(f) for f in fields[3:14]]
        stats[fields[2]] = DiskStats(
            reads=n[0],
            read_sectors=n[2],
            read_ms=n[3],
            writes=n[4],
            write_sectors=n[6],
            write_ms=n[7],
            in_flight=n[8],
            io_ms=n[9],
            weighted_ms=n[10],
        )
    return stats


class DiskstatsCollector:
    name = "diskstats"

    def __init__(self, paths: HostPaths) -> None:
        self.path = paths.proc / "diskstats"

    def collect(self, now: float) -> dict[str, DiskStats]:
        text = read_text(self.path)
        if text is None:
            raise OSError(f"cannot read {self.path}")
        return parse_diskstats(text)


@register("diskstats")
def _from_config(config: AgentConfig) -> DiskstatsCollector:
    return DiskstatsCollector(config.paths)
