"""Lab runs as observations, like any other benchmark.

The lab guest is a node of its own (enrolled once, identity kept in a state directory), and its
devices are that node's inventory: null_blk, and flashsim at each setting it ran with —
classed as the devices they stand in for (a flash SSD, an ultra-low-latency SSD), with the
setting as the evidence. Each fio run in the guest becomes one benchmark observation: the
workload, the configuration it ran under (scheduler and tunables, completion mode) and fio's
metrics; the "together" runs of the fairness cases also carry the FIOS paper's metrics.
"""

from __future__ import annotations

import platform
import uuid
from dataclasses import dataclass
from pathlib import Path

from agent.bench.library import fios
from agent.client import ServiceClient
from agent.contract.tunables import CompletionMode, DeviceConfig, Scheduler
from agent.contract.wire import (
    DeviceCapabilities,
    DeviceClass,
    DeviceInventory,
    InventoryReport,
    ObservationCreate,
    ObservationKind,
    PollCapabilities,
    Transport,
)
from agent.contract.workloads import IOEngine, JobSpec, WorkloadSpec
from agent.enrollment import enroll_node
from agent.errors import NotEnrolled
from agent.state import NodeState
from kernel.lab import scenarios
from kernel.lab.scenarios import LabResult

NULL_DEVICE = "lab-nullb0"
FLASH_DEVICE = "lab-flashsim-flash"
ULL_DEVICE = "lab-flashsim-ull"
POLL_DEVICE = {"ull": ULL_DEVICE, "flash": "lab-flashsim-flash-poll"}
POLLED = set(POLL_DEVICE.values())
MODES = {
    "interrupt": CompletionMode.INTERRUPT,
    "classic": CompletionMode.CLASSIC_POLL,
    "hybrid": CompletionMode.HYBRID_POLL,
}


@dataclass(frozen=True)
class Run:
    device: str
    workload: WorkloadSpec
    configuration: DeviceConfig
    extra: dict[str, float]


def _device(name: str, device_class: DeviceClass, evidence: str, kernel: str) -> DeviceInventory:
    return DeviceInventory(
        name=name,
        model="flashsim (blkpilot lab)" if "flashsim" in name else "null_blk (blkpilot lab)",
        transport=Transport.NULL_BLK if "nullb" in name else Transport.OTHER,
        device_class=device_class,
        class_evidence=[evidence[:200], f"Debian {kernel} under QEMU TCG"],
        holds_data=False,
        capabilities=DeviceCapabilities(
            available_schedulers=[Scheduler(s) for s in scenarios.SCHEDULERS],
            kernel_version=kernel,
            poll=PollCapabilities(
                hybrid_supported=True, poll_queues=1 if "poll" in name or name == ULL_DEVICE else 0
            ),
        ),
    )


def inventory(result: LabResult) -> InventoryReport:
    """The devices this result ran on."""
    kernel = result.kernel
    devices = []
    if result.scenario == "null-overhead":
        devices.append(
            _device(
                NULL_DEVICE,
                DeviceClass.VIRTUAL,
                "null_blk, 10 µs timer completions, memory backed",
                kernel,
            )
        )
    elif result.scenario.startswith("flash-fairness"):
        devices.append(
            _device(
                FLASH_DEVICE, DeviceClass.NVME_FLASH, f"flashsim {scenarios.FLASH_LIKE}", kernel
            )
        )
    elif result.scenario == "flash-polling":
        for setting, read_ns in scenarios.POLL_DEVICES.items():
            device_class = DeviceClass.ULL if setting == "ull" else DeviceClass.NVME_FLASH
            devices.append(
                _device(
                    POLL_DEVICE[setting],
                    device_class,
                    f"flashsim read {read_ns} ns, 4 units, 1 poll queue",
                    kernel,
                )
            )
    return InventoryReport(kernel_version=kernel, devices=devices)


def runs(result: LabResult) -> dict[str, Run]:
    """Each fio run of the result: on which device, with which workload and configuration."""
    found: dict[str, Run] = {}
    library = {w.name: w for w in fios()}
    for label in result.runs:
        parts = label.split("/")
        if result.scenario == "null-overhead":
            scheduler, _ = parts
            workload = WorkloadSpec(
                name="hs23-null-randread-4k-qd1", engine=IOEngine.PSYNC, jobs=[JobSpec(name="qd1")]
            )
            found[label] = Run(
                NULL_DEVICE, workload, DeviceConfig(scheduler=Scheduler(scheduler)), {}
            )
        elif result.scenario == "flash-polling":
            device, size, mode, _ = parts
            block = 4096 if size == "4k" else 131072
            engine = IOEngine.IO_URING if mode == "interrupt" else IOEngine.IO_URING_POLL
            workload = WorkloadSpec(
                name=f"hs22-randread-{size}-qd1",
                engine=engine,
                jobs=[JobSpec(name="p", block_sizes={block: 100})],
            )
            config = DeviceConfig(scheduler=Scheduler.NONE, completion=MODES[mode])
            found[label] = Run(POLL_DEVICE[device], workload, config, {})
        else:
            name, scheduler, kind = parts
            workload = library[name]
            if kind.startswith("alone-"):
                job = next(j for j in workload.jobs if j.name == kind.removeprefix("alone-"))
                alone = [job.model_copy(update={"tasks": 1})]
                workload = workload.model_copy(update={"name": f"{name}-{kind}", "jobs": alone})
            kernel_name = scheduler.split("+")[0]
            tunables = dict(result.tunables.get(kernel_name, {}))
            tunables.update(scenarios.FIOS_VARIANTS.get(scheduler, {}))
            config = DeviceConfig(
                scheduler=Scheduler(kernel_name),
                scheduler_tunables=tunables if kernel_name == "fios" else {},
            )
            extra = {}
            if kind == "together":
                case = result.summary[name][scheduler]
                extra = {
                    "worst_slowdown": float(case["worst_slowdown"]),
                    "worst_slowdown_over_proportional": float(case["worst_over_proportional"]),
                    "concurrent_efficiency": float(case["concurrent_efficiency"]),
                }
            found[label] = Run(FLASH_DEVICE, workload, config, extra)
    return found


def observations(result: LabResult, device_ids: dict[str, uuid.UUID]) -> list[ObservationCreate]:
    return [
        ObservationCreate(
            device_id=device_ids[run.device],
            kind=ObservationKind.BENCHMARK,
            tool="fio",
            workload=run.workload,
            configuration=run.configuration,
            metrics={**result.runs[label], **run.extra},
            started_at=result.started_at,
            finished_at=result.finished_at,
        )
        for label, run in runs(result).items()
    ]


def lab_node(
    state_dir: Path, server_url: str | None = None, enrollment_token: str | None = None
) -> NodeState:
    """The lab's node identity: the one kept in state_dir, or a new enrollment."""
    try:
        return NodeState.load(state_dir)
    except NotEnrolled:
        if not (server_url and enrollment_token):
            raise
    hostname = f"{platform.node()}-lab"
    return enroll_node(
        server_url,
        enrollment_token,
        state_dir,
        hostname=hostname,
        labels={"blkpilot.io/lab": "qemu-tcg"},
    )


def report(result: LabResult, node: NodeState) -> int:
    """Report the lab's devices (added to what the lab node reported before) and record one
    observation per run. Returns how many were recorded."""
    with ServiceClient(node.server_url, node.node_token) as client:
        known = {d["name"]: d for d in client.devices(node.node_id) if d.get("present", True)}
        current = inventory(result)
        wanted = {d.name: d for d in current.devices}
        for name, device in known.items():
            if name not in wanted:
                wanted[name] = DeviceInventory.model_validate(
                    {k: device[k] for k in DeviceInventory.model_fields if k in device}
                )
        client.put_inventory(
            node.node_id,
            InventoryReport(kernel_version=current.kernel_version, devices=list(wanted.values())),
        )
        ids = {d["name"]: uuid.UUID(d["id"]) for d in client.devices(node.node_id)}
        recorded = 0
        for observation in observations(result, ids):
            client.record_observation(observation)
            recorded += 1
    return recorded
