"""One definition per concept (issue 33 item 5): the metrics' directions, the objectives'
metrics, and the rules the canaries judge by all read agent/contract/metrics.py — a rule or
an objective that disagreed with it would show an operator a gain with the wrong sign."""

from __future__ import annotations

from agent.contract.metrics import METRICS
from agent.contract.verdict import DEFAULT_RULES
from agent.live_judge import LIVE_RULES
from models.dataset import OBJECTIVE_METRIC
from models.priors import Objective


def test_every_objective_is_learned_on_a_defined_metric() -> None:
    for objective in Objective:
        assert objective.metric is METRICS[objective.metric.name]
        assert OBJECTIVE_METRIC[objective] == (
            objective.metric.name,
            objective.metric.higher_is_better,
        )


def test_the_canaries_judge_each_metric_in_its_defined_direction() -> None:
    for rule in (*DEFAULT_RULES, *LIVE_RULES):
        assert rule.higher_is_better is METRICS[rule.metric].higher_is_better, rule


def test_a_gain_is_an_improvement_whatever_the_direction() -> None:
    assert METRICS["lat_p50_us"].gain(-0.2) == 0.2  # 20 % lower latency: +20 %
    assert METRICS["iops"].gain(-0.2) == -0.2  # 20 % fewer IOPS: -20 %
    assert all(m.unit for m in METRICS.values())


def test_every_candidate_the_search_offers_is_one_the_agent_would_apply() -> None:
    """The search's grid, the models' tunable features and the agent's allow-list agree: a
    candidate the agent refused would be recommended and could never be applied."""
    from agent.applier import plan
    from agent.contract.tunables import SCHEDULER_TUNABLES, Scheduler
    from agent.contract.wire import DeviceClass
    from agent.discovery import KernelFacts
    from models.features import TUNABLES, DeviceFacts
    from models.search import candidates

    allowed = {name for names in SCHEDULER_TUNABLES.values() for name in names}
    seen: set[str] = set()
    # a kernel before 6.4 (hybrid polling offered) and after (it was offered there too, and
    # refused by the agent: a recommendation that could never be applied)
    for kernel, hybrid in ((KernelFacts("5.15.0", (5, 15), 250), True),
                           (KernelFacts("6.18.0", (6, 18), 1000), False)):  # fmt: skip
        for device_class in DeviceClass:
            device = DeviceFacts(device_class, poll_queues=2, hybrid_poll=hybrid)
            for config in candidates(device, list(Scheduler)):
                plan(config, kernel, "none")  # ChangeRefused if the allow-list disagrees
                seen |= set(config.scheduler_tunables)
    assert seen <= allowed
    assert seen <= set(TUNABLES) | {"slice_idle"}, seen - set(TUNABLES)
