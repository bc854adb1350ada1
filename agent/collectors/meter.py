"""An external power meter's log (like the HOBO plug-load logger the papers used): a CSV of
timestamp and watts, appended to as it measures. The collector reads new lines and integrates
them into a cumulative energy counter, using the meter's own timestamps."""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

from agent.collectors import register
from agent.config import AgentConfig
from agent.contract.wire import PowerScope
from agent.power import PowerSample


def parse_timestamp(text: str) -> float:
    text = text.strip()
    try:
        return float(text)  # epoch seconds
    except ValueError:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            raise ValueError(f"timestamp {text!r} has no timezone") from None
        return moment.timestamp()


def parse_rows(lines: list[str]) -> list[tuple[float, float]]:
    """(epoch seconds, watts) rows; a header and malformed lines are skipped."""
    rows = []
    for row in csv.reader(lines):
        if len(row) < 2:
            continue
        try:
            at, watts = parse_timestamp(row[0]), float(row[1])
        except ValueError:
            continue
        if watts >= 0:
            rows.append((at, watts))
    return rows


class MeterCollector:
    name = "meter"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""
        self.last: tuple[float, float] | None = None
        self.joules = 0.0

    def collect(self, now: float) -> list[PowerSample]:
        with self.path.open() as handle:
            handle.seek(self.offset)
            chunk = handle.read()
            self.offset = handle.tell()
        text = self.partial + chunk
        lines = text.split("\n")
        self.partial = lines.pop()  # an unfinished last line waits for the next read
        for at, watts in parse_rows(lines):
            if self.last is not None and at > self.last[0]:
                self.joules += (self.last[1] + watts) / 2 * (at - self.last[0])
            if self.last is None or at > self.last[0]:
                self.last = (at, watts)
        if self.last is None:
            return []
        return [
            PowerSample(
                "meter",
                self.path.name,
                PowerScope.SYSTEM,
                self.last[0],
                energy_joules=self.joules,
                watts=self.last[1],
            )
        ]


@register("meter", power=True)
def _from_config(config: AgentConfig) -> MeterCollector | None:
    return MeterCollector(config.power.meter_csv) if config.power.meter_csv else None
