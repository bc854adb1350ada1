"""What `blkpilot agent status` reports: enrollment, the changes blkpilot made and whether they
still hold, policies paused on the node, an interrupted change, and the spool."""

from __future__ import annotations

from pathlib import Path

from agent.applier import Applier
from agent.collectors.blklat import DEFAULT_OBJECT, why_unavailable
from agent.config import AgentConfig
from agent.errors import AgentError
from agent.spool import Spool
from agent.state import NodeState, PausedPolicies


def node_status(cfg: AgentConfig, directory: Path) -> list[str]:
    lines = []
    try:
        node = NodeState.load(directory)
        lines.append(f"node {node.node_id} ({node.hostname}) enrolled with {node.server_url}")
    except AgentError as error:
        lines.append(str(error))
    applier = Applier(cfg.paths, directory)
    if (directory / "journal.json").exists():
        lines.append("an interrupted change is in the journal: it is undone when the agent starts")
    for device, reason in sorted(applier.held().items()):
        lines.append(f"HELD {'every device' if device == '*' else device}: {reason}")
    for applied in sorted((directory / "applied").glob("*.json")):
        name = applied.stem
        drift = applier.drift(name)
        state = (
            "holds"
            if not drift
            else "DRIFTED: "
            + "; ".join(f"{d.attribute} is {d.actual!r}, not {d.expected!r}" for d in drift)
        )
        lines.append(f"{name}: {applier.applied(name)} — {state}")
    for name, hold in sorted(PausedPolicies(directory).load().items()):
        lines.append(
            f"{name}: policy v{hold.get('version')} PAUSED on this node since {hold.get('at')}:"
            f" {hold.get('why')} (`blkpilot agent resume {name}` ends it)"
        )
    if not (directory / "applied").exists() or not any((directory / "applied").glob("*.json")):
        lines.append("no change of blkpilot's holds on any device")
    if not cfg.ebpf:
        lines.append("eBPF: off in the configuration (ebpf = false): no live canary, no p99")
    else:
        why = why_unavailable(cfg.paths, cfg.ebpf_object or DEFAULT_OBJECT)
        lines.append(
            f"eBPF: UNAVAILABLE: {why}: no live canary, no p99" if why else "eBPF: available"
        )
    spool = Spool(directory / "spool")
    rejected = len(list(spool.rejected_dir.glob("*.reason"))) if spool.rejected_dir.exists() else 0
    lines.append(
        f"spool: {len(spool.pending())} batches ({spool.size_bytes()} bytes), {rejected} rejected"
    )
    held = spool.clock_hold()
    if held is not None:
        lines.append(
            f"CLOCK AHEAD: since {held.get('since')} the service finds this node's telemetry in"
            f" its future (a batch ends {held.get('batch_ends')}): check NTP; the batches are"
            " held and sent as real time catches up"
        )
    return lines
