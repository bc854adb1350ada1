"""The FIOS paper's fairness metrics (FAST '12, section 5):

- I/O slowdown ratio of a task: its mean I/O latency running concurrently over running alone;
- proportional slowdown: with n tasks, fair sharing slows each task by a factor of n — a task
  slowed by more than that got less than its share;
- concurrent efficiency: the sum over tasks of concurrent throughput over alone throughput
  (equation 2): 1.0 is the throughput of one task alone; more means parallelism paid off."""

from __future__ import annotations

from dataclasses import dataclass

from agent.bench.fio import TaskResult


@dataclass(frozen=True)
class Alone:
    mean_latency_us: float
    iops: float


def fairness(concurrent: list[TaskResult], alone: dict[str, Alone]) -> dict[str, float]:
    """alone: each job's single task run by itself, with the same settings."""
    n = len(concurrent)
    metrics: dict[str, float] = {"proportional_slowdown": float(n)}
    slowdowns, efficiency = [], 0.0
    for task in concurrent:
        base = alone[task.job]
        slowdown = task.mean_latency_us / base.mean_latency_us if base.mean_latency_us else 0.0
        slowdowns.append(slowdown)
        metrics[f"slowdown_{task.job}_{task.index}"] = slowdown
        efficiency += task.iops / base.iops if base.iops else 0.0
    metrics["worst_slowdown"] = max(slowdowns)
    metrics["worst_slowdown_over_proportional"] = max(slowdowns) / n
    metrics["concurrent_efficiency"] = efficiency
    return metrics
