"""Canaries as the node runs them: one asked for on the command line (kept on pass, reported to
the service), and the canaries the nightly job scheduled for this node (measurements: the
device returns to its configuration whatever the verdict, and the service closes each).

Which canary: on a device that holds data, the live canary (its own traffic, eBPF histograms,
nothing written); on a scratch device, the synthetic one (the workload run on it). Either can be
asked for by name."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from agent.applier import Applier
from agent.bench.energy import EnergyMeter
from agent.bench.report import canary_observations
from agent.bench.target import device_target
from agent.canary import CanaryResult, describe, run_canary
from agent.collectors.blklat import DEFAULT_OBJECT, BlkLatCollector
from agent.config import AgentConfig
from agent.contract.tunables import DeviceConfig
from agent.contract.workloads import WorkloadSpec
from agent.live_canary import LiveReport, LiveSettings, live_statistics, run_live_canary
from agent.power_sources import power_collectors
from agent.state import NodeState

Echo = Callable[[str], None]
Mode = Literal["auto", "synthetic", "live"]


@dataclass(frozen=True)
class CanaryRun:
    """A canary's verdict with what it ran: the workload is the live traffic's description
    for a live canary."""

    result: CanaryResult
    workload: WorkloadSpec
    live: LiveReport | None = None

    def statistics(self) -> dict[str, float]:
        found = self.result.statistics()
        if self.live is not None:
            found.update(live_statistics(self.live))
        return found

    def evidence(self, device: str, candidate: DeviceConfig) -> dict[str, Any]:
        """What the judge saw, to audit the verdict or judge it again: each metric's samples
        per arm in the order taken (one a pair, or a round), the looks planned (after how
        many) and taken, and live each pair's I/O rates, CPU stall shares and latency histograms,
        and the pairs set aside."""
        result = self.result
        found: dict[str, Any] = {
            "device": device,
            "candidate": candidate.model_dump(mode="json", exclude_none=True),
            "mode": "synthetic" if self.live is None else "live",
            "verdict": result.verdict.value,
            "alpha": result.alpha,
            "looks_planned": result.budget.looks() if result.budget else [result.rounds],
            "looks_taken": result.looks,
            "samples": result.samples,
            "per_metric": describe(result),
            "notes": result.notes,
        }
        if self.live is not None:
            found |= {
                "rates": self.live.rates,
                "cpu_stall": self.live.cpu_stall,
                "latency": self.live.latency,
                "rules": self.live.rules,
                "fail_only": self.live.fail_only,
                "pairs_set_aside": self.live.pairs_set_aside,
                "set_aside_because": self.live.reasons,
                "guard_tripped": self.live.guard_tripped,
                "reference_mix": self.live.weights,
                "classes": self.live.classes,
                "left_out": self.live.left_out,
                "loop": self.live.loop,
                "loop_why": self.live.loop_why,
                "interval_s": self.live.interval_s,
            }
        return found


def live_for(cfg: AgentConfig, device: str, mode: Mode) -> bool:
    """Whether this device gets the live canary: asked for, or (auto) the device holds data."""
    if mode != "auto":
        return mode == "live"
    return device_target(cfg.paths, device).holds_data


def run_any_canary(
    cfg: AgentConfig,
    directory: Path,
    device: str,
    workload: WorkloadSpec,
    candidate: DeviceConfig,
    *,
    mode: Mode = "auto",
    rounds: int = 8,
    max_rounds: int | None = None,
    round_seconds: float = 1.0,
    alpha: float = 0.05,
    live: LiveSettings | None = None,
) -> CanaryRun:
    applier = Applier(cfg.paths, directory)
    if live_for(cfg, device, mode):
        collector = BlkLatCollector(cfg.paths, cfg.ebpf_object or DEFAULT_OBJECT, devices=[device])
        try:
            settings = live or LiveSettings(alpha=alpha)
            if settings.sli is None and cfg.sli_for(device) is not None:
                settings = replace(settings, sli=cfg.sli_for(device))
            result, report, traffic = run_live_canary(
                applier, device, candidate, collector, settings
            )
        finally:
            collector.close()
        return CanaryRun(result, traffic, report)
    result = run_canary(
        applier,
        device,
        workload,
        candidate,
        workdir=directory / "bench",
        rounds=rounds,
        max_rounds=max_rounds,
        round_seconds=round_seconds,
        alpha=alpha,
        meter=EnergyMeter(power_collectors(cfg)),
    )
    return CanaryRun(result, workload)


def report_canary(directory: Path, device: str, candidate: DeviceConfig, run: CanaryRun) -> str:
    """Send the verdict (and the baseline arm as a benchmark) to the service; says what
    happened. Raises AgentError when the service cannot be told."""
    node = NodeState.load(directory)
    with node.client() as client:
        ids = {d["name"]: d["id"] for d in client.devices(node.node_id)}
        if device not in ids:
            return f"not reported: the service does not know {device} yet (agent run reports it)"
        canary, baseline = canary_observations(
            uuid.UUID(ids[device]), run.workload, candidate, run.result, run.statistics()
        )
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
    expected_gain: float  # the search's optimistic bound (UCB): what ranks it, not a prediction
    prediction: dict[str, Any] | None = None  # its recommendation's, where it is one

    def describe(self) -> str:
        """The prediction as every view shows it — gain, improvement, higher is better, 80 %
        interval — where the canary tries a recommendation; an exploration's bound otherwise,
        said to be one (it read "expected gain +149.9 %" beside a card's +45.0 %)."""
        if self.prediction:
            p = self.prediction
            why = (
                f"recommended for {p.get('objective', 'its objective')}: predicted gain"
                f" {p['gain']:+.1%} ({p['gain_low']:+.1%} … {p['gain_high']:+.1%}),"
                " higher is better"
            )
        else:
            why = f"exploring: optimistic bound on its gain {self.expected_gain:+.1%} (UCB)"
        return (
            f"#{self.rank} {self.device}: {self.workload.name} under"
            f" {self.candidate.model_dump_json(exclude_none=True)} ({why})"
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
    max_rounds: int | None = None,
) -> int:
    """List this node's scheduled canaries, best first; with `run`, run the first `limit` of
    them, record each verdict and close it. Returns how many were scheduled."""
    node = NodeState.load(directory)
    with node.client() as client:
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
                item.get("prediction") and {**item["prediction"], "objective": item["objective"]},
            )
            for item in client.scheduled_canaries(node.node_id)
        ]
        for item in scheduled[: limit if run else None]:
            echo(item.describe())
            if not run:
                continue
            measured = _measure(cfg, directory, item, rounds, max_rounds, round_seconds)
            result = measured.result
            canary, baseline = canary_observations(
                item.device_id, measured.workload, item.candidate, result, measured.statistics()
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
    cfg: AgentConfig,
    directory: Path,
    item: ScheduledCanaryRun,
    rounds: int,
    max_rounds: int | None,
    round_seconds: float,
) -> CanaryRun:
    """The canary as a measurement: whatever the verdict, the device ends where it began."""
    run = run_any_canary(
        cfg,
        directory,
        item.device,
        item.workload,
        item.candidate,
        rounds=rounds,
        max_rounds=max_rounds,
        round_seconds=round_seconds,
    )
    if run.result.kept_candidate:
        Applier(cfg.paths, directory).rollback(item.device)  # a measurement, not a change
    return run
