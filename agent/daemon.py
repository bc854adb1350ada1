"""The agent as a daemon: the runner, and its /metrics server, until SIGTERM or SIGINT."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

from agent.config import AgentConfig
from agent.contract.logs import configure as configure_logs
from agent.errors import MetricsPortUnavailable
from agent.exporter import AgentCollector, serve_metrics
from agent.runner import Agent
from agent.state import NodeState


def run_until_signalled(
    cfg: AgentConfig, state: NodeState | None, directory: Path, echo: Callable[[str], None]
) -> None:
    """Runs the agent (offline when `state` is None: it collects and spools) until a signal."""
    configure_logs(cfg.log_format)
    agent = Agent(cfg, state, directory)
    server = None
    if cfg.metrics_port:
        try:
            server = serve_metrics(
                cfg.metrics_address, cfg.metrics_port, AgentCollector(agent).parts
            )
        except OSError as error:
            raise MetricsPortUnavailable(
                f"cannot serve metrics on {cfg.metrics_address}:{cfg.metrics_port}:"
                f" {error.strerror or error} (another agent, or another program, holds it?)"
                " — choose another with --metrics-port or metrics_port in the configuration,"
                " or 0 to turn the exporter off"
            ) from error
        echo(f"metrics on http://{cfg.metrics_address}:{cfg.metrics_port}/metrics")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent.run(stop)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
