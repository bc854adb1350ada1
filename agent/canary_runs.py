"""Canaries as the node runs them: one asked for on the command line (kept on pass, reported to
the service), and the canaries the nightly job scheduled for this node (measurements: the
device returns to its configuration whatever the verdict, and the service closes each)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.applier import Applier
from agent.bench.energy import EnergyMeter
from agent.bench.report import canary_observations
from agent.canary import CanaryResult, run_canary
from agent.client import ServiceClient
from agent.config import AgentConfig
from agent.contract.tunables import DeviceConfig
from agent.contract.workloads import WorkloadSpec
from agent.power_sources import power_collectors
from agent.state import NodeState

Echo = Callable[[str], None]


def report_canary(
    directory: Path, device: str, spec: WorkloadSpec, candidate: DeviceConfig, result: CanaryResult
) -> str:
    """Send the verdict (and the baseline arm as a benchmark) to the service; says what
    happened. Raises AgentError when the service cannot be told."""
    node = NodeState.load(directory)
    with ServiceClient(node.server_url, node.node_token) as client:
        ids = {d["name"]: d["id"] for d in client.devices(node.node_id)}
        if device not in ids:
            return f"not reported: the service does not know {device} yet (agent run reports it)"
        canary, baseline = canary_observations(uuid.UUID(ids[device]), spec, candidate, result)
        client.record_observation(canary)
        if baseline is not None:
            client.record_observation(baseline)
    return "verdict and statistics sent to the service"


@dataclass(frozen=True)
class ScheduledCanaryRun:
    """One of the nightly job's canaries, as this node sees it."""

    canary_id: uuid.UUID
    rank: int
    device_id: uuid.UUID
    device: str
    workload: WorkloadSpec
    candidate: DeviceConfig
    expected_gain: float

    def describe(self) -> str:
        return (
            f"#{self.rank} {self.device}: {self.workload.name} under"
            f" {self.candidate.model_dump_json(exclude_none=True)}"
            f" (expected gain {self.expected_gain:+.1%})"
        )


def scheduled_canaries(
    cfg: AgentConfig,
    directory: Path,
    echo: Echo,
    *,
    run: bool,
    limit: int,
    rounds: int,
    round_seconds: float,
) -> int:
    """List this node's scheduled canaries, best first; with `run`, run the first `limit` of
    them, record each verdict and close it. Returns how many were scheduled."""
    node = NodeState.load(directory)
    with ServiceClient(node.server_url, node.node_token) as client:
        names = {d["id"]: d["name"] for d in client.devices(node.node_id)}
        scheduled = [
            ScheduledCanaryRun(
                uuid.UUID(item["id"]),
                item["rank"],
                uuid.UUID(item["device_id"]),
                names.get(item["device_id"], item["device_id"]),
                WorkloadSpec.model_validate(item["workload"]),
                DeviceConfig.model_validate(item["config"]),
                item["expected_gain"],
            )
            for item in client.scheduled_canaries(node.node_id)
        ]
        for item in scheduled[: limit if run else None]:
            echo(item.describe())
            if not run:
                continue
            result = _measure(cfg, directory, item, rounds, round_seconds)
            canary, baseline = canary_observations(
                item.device_id, item.workload, item.candidate, result
            )
            observation = client.record_observation(canary)
            if baseline is not None:
                client.record_observation(baseline)
            client.canary_done(item.canary_id, uuid.UUID(observation["id"]))
            echo(
                f"  verdict {result.verdict.value}; {item.device} back to its"
                " configuration; result recorded"
            )
    return len(scheduled)


def _measure(
    cfg: AgentConfig, directory: Path, item: ScheduledCanaryRun, rounds: int, round_seconds: float
) -> CanaryResult:
    """The canary as a measurement: whatever the verdict, the device ends where it began."""
    applier = Applier(cfg.paths, directory)
    result = run_canary(
        applier,
        item.device,
        item.workload,
        item.candidate,
        workdir=directory / "bench",
        rounds=rounds,
        round_seconds=round_seconds,
        meter=EnergyMeter(power_collectors(cfg)),
    )
    if result.kept_candidate:
        applier.rollback(item.device)  # a measurement, not a change
    return result
