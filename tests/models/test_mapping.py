"""Workload mapping on real telemetry: the agent's own windows over a loop device while fio
runs a known workload are matched to the benchmarked workload of that shape."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from agent.bench.library import library
from agent.config import AgentConfig
from agent.runner import Agent
from models.mapping import nearest, workload_shape
from tests.agent.conftest import NO_POWER, LoopFactory


def _window_during(device: str, fio_args: list[str], tmp_path: Path) -> dict[str, Any]:
    agent = Agent(AgentConfig(devices=[device], metrics_port=0, power=NO_POWER), None, tmp_path)
    agent.discover_and_report()  # no service: discovery only
    agent.collect()
    subprocess.run(
        [
            "fio",
            "--name=m",
            f"--filename=/dev/{device}",
            "--direct=1",
            "--time_based",
            "--runtime=2",
            "--size=32m",
            "--output=/dev/null",
            *fio_args,
        ],
        check=True,
        timeout=60,
    )
    agent.collect()
    return agent.view.latest[device].model_dump()


def test_what_the_device_does_maps_to_the_benchmark_of_that_shape(
    loop_device: LoopFactory, tmp_path: Path
) -> None:
    device = loop_device(size_mb=64)
    # On a loop device over tmpfs a request completes about as fast as fio submits the next,
    # so at --iodepth=8 the device averaged 1.4-1.7 requests in flight (measured here and in
    # CI): a queue-depth-one workload, truthfully. Submitting and reaping in batches keeps the
    # queue full (9-10 in flight measured, with or without a CPU hog).
    window = _window_during(
        device,
        [
            "--rw=randread",
            "--bs=4k",
            "--ioengine=libaio",
            "--iodepth=32",
            "--iodepth_batch_submit=16",
            "--iodepth_batch_complete_min=8",
        ],
        tmp_path,
    )
    assert window["queue_depth"] >= 2, window
    assert window["read_share"] == 1.0
    (match,) = nearest([window], library().values())
    shape = workload_shape(match.workload)
    assert shape.read_share == 1.0
    assert shape.request_kib == 4
    assert 2 <= shape.in_flight <= 32, (match.workload.name, match.observed)

    writes = _window_during(
        device, ["--rw=randwrite", "--bs=64k", "--ioengine=psync", "--iodepth=1"], tmp_path
    )
    best = nearest([writes], library().values(), k=3)
    assert all(workload_shape(m.workload).read_share <= 0.5 for m in best), best
    assert best[0].distance <= best[-1].distance


def test_an_idle_device_maps_to_nothing() -> None:
    idle = {"iops": 0.0, "read_share": 0.0, "mean_request_bytes": 0.0, "queue_depth": 0.0}
    assert nearest([idle], library().values()) == []


def test_the_median_request_size_not_the_mean(loop_device: LoopFactory, tmp_path: Path) -> None:
    """Nine 4 KiB reads to one 1 MiB read (which reaches the device as requests of 8 KiB to
    1 MiB): the mean request is about 8 KiB, a size few requests have. With eBPF's size
    distribution the device maps to a 4 KiB workload; with diskstats' means only, it does not."""
    device = loop_device(size_mb=64)
    window = _window_during(
        device,
        ["--rw=randread", "--bssplit=4k/90:1m/10", "--ioengine=psync", "--iodepth=1"],
        tmp_path,
    )
    assert window["latency_source"] == "ebpf", window["latency_note"]
    assert window["mean_request_bytes"] > 6 * 1024
    (match,) = nearest([window], library().values())
    assert workload_shape(match.workload).request_kib == 4, match
    means_only = {**window, "operations": []}
    (other,) = nearest([means_only], library().values())
    assert workload_shape(other.workload).request_kib > 4, other
