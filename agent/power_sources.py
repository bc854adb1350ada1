"""The collectors for every power source that exists on this node, from the configuration:
the registered collectors marked as power sources."""

from __future__ import annotations

import logging

from agent.collectors import Collector, collectors_for
from agent.config import AgentConfig

log = logging.getLogger(__name__)


def power_collectors(config: AgentConfig) -> list[Collector]:
    found = collectors_for(config, power_only=True)
    log.info("power sources: %s", ", ".join(c.name for c in found) or "none (power unavailable)")
    return found
