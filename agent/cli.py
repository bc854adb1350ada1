"""`blkpilot agent …`: what runs on every node. Imports nothing from the service."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Annotated

import typer

import blkpilot
from agent.errors import AgentError

app = typer.Typer(
    help="The node agent: enrollment with the service (discovery, telemetry and tuning follow).",
    no_args_is_help=True,
)


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/blkpilot/agent")
    return Path.home() / ".local" / "state" / "blkpilot" / "agent"


StateDir = Annotated[
    Path,
    typer.Option(
        envvar="BLKPILOT_AGENT_STATE_DIR",
        help="Where the node's identity and token are kept.",
        default_factory=default_state_dir,
        show_default="/var/lib/blkpilot/agent as root",
    ),
]


def parse_labels(labels: list[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for label in labels:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{label!r} is not key=value", param_hint="--label")
        parsed[key] = value
    return parsed


def _fail(error: AgentError) -> typer.Exit:
    typer.secho(f"error: {error}", err=True, fg=typer.colors.RED)
    return typer.Exit(code=1)


@app.command()
def enroll(
    server: Annotated[str, typer.Option(envvar="BLKPILOT_SERVER_URL", help="The service's URL.")],
    token: Annotated[
        str, typer.Option(envvar="BLKPILOT_ENROLLMENT_TOKEN", help="One-time enrollment token.")
    ],
    state_dir: StateDir,
    label: Annotated[list[str], typer.Option(help="key=value; repeatable.")] = [],  # noqa: B006
    hostname: Annotated[str, typer.Option(help="Name to enroll under.")] = socket.gethostname(),
) -> None:
    """Trade a one-time enrollment token for this node's own token, kept in the state dir."""
    from agent.enrollment import enroll_node

    try:
        state = enroll_node(server, token, state_dir, hostname=hostname, labels=parse_labels(label))
    except AgentError as error:
        raise _fail(error) from error
    typer.echo(f"enrolled {state.hostname} as node {state.node_id}; state in {state_dir}")


@app.command()
def heartbeat(state_dir: StateDir) -> None:
    """Tell the service this node is alive."""
    from agent.client import ServiceClient
    from agent.state import NodeState
    from agent.wire import Heartbeat

    try:
        state = NodeState.load(state_dir)
        with ServiceClient(state.server_url, state.node_token) as client:
            client.heartbeat(
                state.node_id,
                Heartbeat(agent_version=blkpilot.__version__, kernel_version=platform.release()),
            )
    except AgentError as error:
        raise _fail(error) from error
    typer.echo(f"node {state.node_id}: heartbeat accepted by {state.server_url}")
