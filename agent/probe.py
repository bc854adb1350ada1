"""A short read-only latency probe: 4 KB random reads at queue depth 1, O_DIRECT.

It only ever opens the device read-only. Times include the Python call overhead (about a
microsecond), which the evidence says.
"""

from __future__ import annotations

import mmap
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

BLOCK = 4096


@dataclass(frozen=True)
class ProbeResult:
    reads: int
    median_us: float
    p99_us: float


def probe(
    node: Path, *, reads: int = 2_000, warmup: int = 200, span_bytes: int = 1 << 30
) -> ProbeResult:
    fd = os.open(node, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        blocks = max(1, min(size, span_bytes) // BLOCK)
        buffer = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
        rng = random.Random(0x5EED)  # noqa: S311 (offsets, not secrets)
        samples: list[int] = []
        for i in range(warmup + reads):
            offset = rng.randrange(blocks) * BLOCK
            started = time.perf_counter_ns()
            os.preadv(fd, [buffer], offset)
            elapsed = time.perf_counter_ns() - started
            if i >= warmup:
                samples.append(elapsed)
        buffer.close()
    finally:
        os.close(fd)
    samples.sort()
    return ProbeResult(
        reads=reads,
        median_us=statistics.median(samples) / 1_000,
        p99_us=samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1_000,
    )
