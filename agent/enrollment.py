from __future__ import annotations

import platform
from pathlib import Path

from agent.client import ServiceClient
from agent.contract import __version__
from agent.contract.wire import EnrollRequest
from agent.state import NodeState


def enroll_node(
    server_url: str,
    enrollment_token: str,
    state_dir: Path,
    *,
    hostname: str,
    labels: dict[str, str],
    ca_bundle: Path | None = None,
) -> NodeState:
    """Enroll with the service and keep the node's identity in state_dir (with the CA bundle
    its certificate is verified against, for every later call)."""
    if ca_bundle is not None:
        ca_bundle = ca_bundle.resolve()
    with ServiceClient(server_url, ca_bundle=ca_bundle) as client:
        enrolled = client.enroll(
            EnrollRequest(
                enrollment_token=enrollment_token,
                hostname=hostname,
                labels=labels,
                agent_version=__version__,
                kernel_version=platform.release(),
            )
        )
    state = NodeState(
        server_url=server_url,
        node_id=enrolled.node_id,
        node_token=enrolled.node_token,
        hostname=hostname,
        token_expires_at=enrolled.expires_at,
        renew_after=enrolled.renew_after,
        ca_bundle=ca_bundle,
    )
    state.save(state_dir)
    return state
