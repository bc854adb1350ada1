"""`blkpilot agent …`: what runs on every node. Imports nothing from the service."""

from __future__ import annotations

import os
import platform
import socket
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agent.contract import __version__
from agent.contract.labels import parse_labels
from agent.errors import AgentError

if TYPE_CHECKING:
    from agent.canary import CanaryResult
    from agent.config import AgentConfig
    from agent.contract.tunables import DeviceConfig
    from agent.contract.workloads import WorkloadSpec

app = typer.Typer(
    help="The node agent: discovery, telemetry with power, safe sysfs changes, reporting.",
    no_args_is_help=True,
)


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/blkpilot/agent")
    return Path.home() / ".local" / "state" / "blkpilot" / "agent"


ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="BLKPILOT_AGENT_CONFIG",
        help="TOML [default: /etc/blkpilot/agent.toml if present].",
    ),
]
Devices = Annotated[list[str], typer.Option("--device", help="Only this device; repeatable.")]

StateDir = Annotated[
    Path,
    typer.Option(
        envvar="BLKPILOT_AGENT_STATE_DIR",
        help="Where the node's identity and token are kept.",
        default_factory=default_state_dir,
        show_default="/var/lib/blkpilot/agent as root",
    ),
]


def labels_option(labels: list[str]) -> dict[str, str]:
    """`--label key=value` options, or the option's error."""
    try:
        return parse_labels(labels)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--label") from error


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
        state = enroll_node(
            server, token, state_dir, hostname=hostname, labels=labels_option(label)
        )
    except AgentError as error:
        raise _fail(error) from error
    typer.echo(f"enrolled {state.hostname} as node {state.node_id}; state in {state_dir}")


@app.command()
def heartbeat(state_dir: StateDir) -> None:
    """Tell the service this node is alive."""
    from agent.client import ServiceClient
    from agent.contract.wire import Heartbeat
    from agent.state import NodeState

    try:
        state = NodeState.load(state_dir)
        with ServiceClient(state.server_url, state.node_token) as client:
            client.heartbeat(
                state.node_id,
                Heartbeat(agent_version=__version__, kernel_version=platform.release()),
            )
    except AgentError as error:
        raise _fail(error) from error
    typer.echo(f"node {state.node_id}: heartbeat accepted by {state.server_url}")


def _load_config(path: Path | None) -> AgentConfig:
    from pydantic import ValidationError

    from agent.config import AgentConfig

    try:
        return AgentConfig.load(path)
    except (OSError, ValidationError, ValueError) as error:
        typer.secho(f"error: configuration: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from error


@app.command()
def discover(
    config: ConfigFile = None,
    device: Devices = [],  # noqa: B006
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    probe: Annotated[
        bool, typer.Option(help="Also measure 4 KB QD1 random-read latency (read-only).")
    ] = False,
) -> None:
    """List block devices: identity, class and why, queue settings, whether they hold data."""
    import json

    from rich.console import Console
    from rich.table import Table

    from agent.discovery import discover as run_discovery

    cfg = _load_config(config)
    found = run_discovery(cfg.paths, with_probe=probe, only=set(device) or None)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "kernel": found.kernel.release,
                    "devices": [d.inventory.model_dump(mode="json") for d in found.devices],
                    "skipped": found.skipped,
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"block devices (kernel {found.kernel.release})")
    for column in ("device", "class", "transport", "model", "scheduler", "holds data", "evidence"):
        table.add_column(column)
    for d in found.devices:
        inv = d.inventory
        current = inv.capabilities.current_scheduler
        table.add_row(
            inv.name,
            inv.device_class.value,
            inv.transport.value,
            inv.model or "-",
            current.value if current else "-",
            "yes: " + "; ".join(inv.holds_data_reasons) if inv.holds_data else "no",
            "; ".join(inv.class_evidence),
        )
    Console().print(table)
    for name, why in sorted(found.skipped.items()):
        typer.echo(f"skipped {name}: {why}")


@app.command()
def run(
    state_dir: StateDir,
    config: ConfigFile = None,
    device: Devices = [],  # noqa: B006
    interval: Annotated[float | None, typer.Option(help="Seconds per telemetry window.")] = None,
    push_interval: Annotated[float | None, typer.Option(help="Seconds between sends.")] = None,
    policy_interval: Annotated[
        float | None, typer.Option(help="Seconds between fetching policies and checking drift.")
    ] = None,
    metrics_port: Annotated[int | None, typer.Option(help="0 turns the exporter off.")] = None,
    offline: Annotated[bool, typer.Option(help="Collect and spool without a service.")] = False,
) -> None:
    """Run the agent: telemetry, inventory, policies and drift, and /metrics on a local port."""
    import logging
    import signal
    import threading

    from prometheus_client import start_http_server

    from agent.exporter import registry_for
    from agent.runner import Agent
    from agent.state import NodeState

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = _load_config(config)
    overrides = {
        "interval_s": interval,
        "push_interval_s": push_interval,
        "policy_interval_s": policy_interval,
        "metrics_port": metrics_port,
        "devices": list(device) or None,
    }
    cfg = cfg.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    state = None
    if not offline:
        try:
            state = NodeState.load(cfg.state_dir or state_dir)
        except AgentError as error:
            raise _fail(error) from error
    agent = Agent(cfg, state, cfg.state_dir or state_dir)
    server = None
    if cfg.metrics_port:
        server, _ = start_http_server(cfg.metrics_port, cfg.metrics_address, registry_for(agent))
        typer.echo(f"metrics on http://{cfg.metrics_address}:{cfg.metrics_port}/metrics")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        agent.run(stop)
    finally:
        if server is not None:
            server.shutdown()


def _device_config(
    scheduler: str | None,
    tunables: list[str],
    nr_requests: int | None,
    read_ahead_kb: int | None,
    completion: str | None = None,
) -> DeviceConfig:
    """A configuration from command-line options; invalid ones exit with status 2."""
    from pydantic import ValidationError

    from agent.contract.tunables import DeviceConfig

    try:
        return DeviceConfig.model_validate(
            {
                "scheduler": scheduler,
                "scheduler_tunables": _parse_tunables(tunables),
                "nr_requests": nr_requests,
                "read_ahead_kb": read_ahead_kb,
                "completion": completion,
            }
        )
    except ValidationError as error:
        typer.secho(f"error: refused: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from error


def _parse_tunables(values: list[str]) -> dict[str, int]:
    parsed: dict[str, int] = {}
    for item in values:
        key, sep, value = item.partition("=")
        try:
            parsed[key] = int(value)
        except ValueError:
            raise typer.BadParameter(
                f"{item!r} is not name=integer", param_hint="--tunable"
            ) from None
        if not sep:
            raise typer.BadParameter(f"{item!r} is not name=integer", param_hint="--tunable")
    return parsed


@app.command()
def apply(
    device: Annotated[str, typer.Argument(help="e.g. nvme0n1")],
    state_dir: StateDir,
    scheduler: Annotated[
        str | None, typer.Option(help="none, mq-deadline, kyber, bfq, fios")
    ] = None,
    tunable: Annotated[
        list[str], typer.Option(help="name=value under queue/iosched; repeatable")
    ] = [],  # noqa: B006
    nr_requests: Annotated[int | None, typer.Option()] = None,
    read_ahead_kb: Annotated[int | None, typer.Option()] = None,
    completion: Annotated[
        str | None, typer.Option(help="interrupt, classic_poll, hybrid_poll")
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(help="A whole configuration as JSON (e.g. from `agent current --out`)."),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Show the writes; make none.")] = False,
    config: ConfigFile = None,
) -> None:
    """Change a device's configuration now: checked, snapshotted, journaled, read back."""

    from agent.applier import Applier
    from agent.effects import Effects

    cfg = _load_config(config)
    if config_file is not None:
        if scheduler or tunable or nr_requests or read_ahead_kb or completion:
            raise typer.BadParameter("either --config-file or the options, not both")
        wanted = _config_from_file(config_file)
    else:
        wanted = _device_config(scheduler, tunable, nr_requests, read_ahead_kb, completion)
    applier = Applier(cfg.paths, cfg.state_dir or state_dir, Effects(dry_run=dry_run))
    try:
        with applier.device_lock(device):  # never in the middle of a canary on the device
            result = applier.apply(device, wanted)
    except AgentError as error:
        raise _fail(error) from error
    for path, value in applier.effects.writes:
        typer.echo(f"{'would write' if dry_run else 'wrote'} {value!r} to {path}")
    if not dry_run:
        typer.echo(f"applied to {device}; before: {result.before}")
        typer.echo(f"undo with: blkpilot agent rollback {device}")


def _config_from_file(path: Path) -> DeviceConfig:
    from pydantic import ValidationError

    from agent.contract.tunables import DeviceConfig

    try:
        return DeviceConfig.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as error:
        typer.secho(f"error: refused: {path}: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from error


@app.command()
def current(
    device: Annotated[str, typer.Argument(help="e.g. nvme0n1")],
    state_dir: StateDir,
    out: Annotated[
        Path | None, typer.Option(help="Write it here (atomically) instead of printing it.")
    ] = None,
    keep_existing: Annotated[
        bool, typer.Option(help="If --out exists already, leave it: the first capture counts.")
    ] = False,
    config: ConfigFile = None,
) -> None:
    """The device's configuration now, as JSON that `agent apply --config-file` takes back.

    A rollout captures it before it changes a device (with --keep-existing, so a retried
    step keeps what the device had before the rollout, not what the first try left)."""
    from agent.applier import Applier
    from agent.fsutil import write_json_atomic

    cfg = _load_config(config)
    try:
        found = Applier(cfg.paths, cfg.state_dir or state_dir).current(device)
    except AgentError as error:
        raise _fail(error) from error
    document = found.model_dump(mode="json", exclude_none=True)
    if out is None:
        import json

        typer.echo(json.dumps(document, sort_keys=True))
    elif keep_existing and out.exists():
        typer.echo(f"kept the earlier capture in {out}")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, document)
        typer.echo(f"captured {device} in {out}")


def workload_option(name: str | None, spec_file: Path | None) -> WorkloadSpec:
    from pydantic import ValidationError

    from agent.contract.workloads import WorkloadSpec

    if spec_file is not None:
        try:
            return WorkloadSpec.model_validate_json(spec_file.read_text())
        except (OSError, ValidationError) as error:
            raise typer.BadParameter(str(error), param_hint="--workload-file") from error
    from agent.bench.library import library as named

    workloads = named()
    if name is None or name not in workloads:
        known = ", ".join(sorted(workloads)[:8])
        raise typer.BadParameter(
            f"{name!r} is not a named workload (e.g. {known}, …)", param_hint="--workload"
        )
    return workloads[name]


@app.command()
def canary(
    device: Annotated[str, typer.Argument(help="e.g. nvme0n1")],
    state_dir: StateDir,
    workload: Annotated[
        str | None, typer.Option(help="A named workload.")
    ] = "hs23-single-randread-4k-qd1",
    workload_file: Annotated[Path | None, typer.Option(help="A workload spec as JSON.")] = None,
    scheduler: Annotated[str | None, typer.Option(help="The candidate's scheduler.")] = None,
    tunable: Annotated[list[str], typer.Option(help="name=value; repeatable")] = [],  # noqa: B006
    nr_requests: Annotated[int | None, typer.Option()] = None,
    read_ahead_kb: Annotated[int | None, typer.Option()] = None,
    config_file: Annotated[
        Path | None, typer.Option(help="The candidate as a whole configuration (JSON).")
    ] = None,
    rounds: Annotated[int, typer.Option(min=3, max=100, help="Samples per arm.")] = 8,
    round_seconds: Annotated[float, typer.Option(min=0.1, max=600)] = 1.0,
    alpha: Annotated[float, typer.Option(min=0.001, max=0.5)] = 0.05,
    report: Annotated[bool, typer.Option(help="Send the verdict to the service.")] = True,
    config: ConfigFile = None,
) -> None:
    """Candidate against the current configuration, interleaved; keep it only on pass.

    Exit status: 0 pass (candidate kept), 1 fail, 3 inconclusive (baseline restored)."""
    import json

    from agent.applier import Applier
    from agent.bench.energy import EnergyMeter
    from agent.canary import describe, run_canary
    from agent.power_sources import power_collectors

    cfg = _load_config(config)
    directory = cfg.state_dir or state_dir
    spec = workload_option(workload, workload_file)
    if config_file is not None:
        if scheduler or tunable or nr_requests or read_ahead_kb:
            raise typer.BadParameter("either --config-file or the options, not both")
        candidate = _config_from_file(config_file)
    else:
        candidate = _device_config(scheduler, tunable, nr_requests, read_ahead_kb)
    applier = Applier(cfg.paths, directory)
    meter = EnergyMeter(power_collectors(cfg))
    try:
        result = run_canary(
            applier,
            device,
            spec,
            candidate,
            workdir=directory / "bench",
            rounds=rounds,
            round_seconds=round_seconds,
            alpha=alpha,
            meter=meter,
        )
    except AgentError as error:
        raise _fail(error) from error
    for row in describe(result):
        typer.echo(json.dumps(row))
    typer.echo(
        f"verdict: {result.verdict.value} after {result.rounds} rounds in {result.seconds:.1f} s;"
        f" {'candidate kept' if result.kept_candidate else 'baseline restored'}"
    )
    if report:
        _report_canary(directory, device, spec, candidate, result)
    raise typer.Exit(code={"pass": 0, "fail": 1, "inconclusive": 3}[result.verdict.value])


def _report_canary(
    directory: Path, device: str, spec: WorkloadSpec, candidate: DeviceConfig, result: CanaryResult
) -> None:
    from agent.bench.report import canary_observations
    from agent.client import ServiceClient
    from agent.state import NodeState

    try:
        node = NodeState.load(directory)
        with ServiceClient(node.server_url, node.node_token) as client:
            ids = {d["name"]: d["id"] for d in client.devices(node.node_id)}
            if device not in ids:
                typer.echo(
                    f"not reported: the service does not know {device} yet (agent run reports it)"
                )
                return
            canary, baseline = canary_observations(uuid.UUID(ids[device]), spec, candidate, result)
            client.record_observation(canary)
            if baseline is not None:
                client.record_observation(baseline)
        typer.echo("verdict and statistics sent to the service")
    except AgentError as error:
        typer.secho(f"verdict not sent to the service: {error}", err=True, fg=typer.colors.YELLOW)


@app.command()
def canaries(
    state_dir: StateDir,
    run: Annotated[bool, typer.Option("--run", help="Run them (else only list).")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, best first.")] = 1,
    rounds: Annotated[int, typer.Option(min=3, max=100, help="Samples per arm.")] = 8,
    round_seconds: Annotated[float, typer.Option(min=0.1, max=600)] = 1.0,
    config: ConfigFile = None,
) -> None:
    """The canaries the nightly job scheduled on this node's devices. With --run, each is a
    measurement: candidate against the device's configuration, interleaved, the verdict and
    statistics recorded; the device then returns to its configuration whatever the verdict
    (the operator decides through the recommendations), and the canary is closed."""
    from agent.applier import Applier
    from agent.bench.energy import EnergyMeter
    from agent.bench.report import canary_observations
    from agent.canary import run_canary
    from agent.client import ServiceClient
    from agent.contract.tunables import DeviceConfig
    from agent.contract.workloads import WorkloadSpec
    from agent.power_sources import power_collectors
    from agent.state import NodeState

    cfg = _load_config(config)
    directory = cfg.state_dir or state_dir
    try:
        node = NodeState.load(directory)
        with ServiceClient(node.server_url, node.node_token) as client:
            scheduled = client.scheduled_canaries(node.node_id)
            names = {d["id"]: d["name"] for d in client.devices(node.node_id)}
            if not scheduled:
                typer.echo("no canaries scheduled for this node")
                return
            for item in scheduled[: limit if run else None]:
                device = names.get(item["device_id"], item["device_id"])
                candidate = DeviceConfig.model_validate(item["config"])
                spec = WorkloadSpec.model_validate(item["workload"])
                typer.echo(
                    f"#{item['rank']} {device}: {spec.name} under"
                    f" {candidate.model_dump_json(exclude_none=True)}"
                    f" (expected gain {item['expected_gain']:+.1%})"
                )
                if not run:
                    continue
                applier = Applier(cfg.paths, directory)
                result = run_canary(
                    applier,
                    device,
                    spec,
                    candidate,
                    workdir=directory / "bench",
                    rounds=rounds,
                    round_seconds=round_seconds,
                    meter=EnergyMeter(power_collectors(cfg)),
                )
                if result.kept_candidate:
                    applier.rollback(device)  # a measurement, not a change
                canary, baseline = canary_observations(
                    uuid.UUID(item["device_id"]), spec, candidate, result
                )
                observation = client.record_observation(canary)
                if baseline is not None:
                    client.record_observation(baseline)
                client.canary_done(uuid.UUID(item["id"]), uuid.UUID(observation["id"]))
                typer.echo(
                    f"  verdict {result.verdict.value}; {device} back to its"
                    " configuration; result recorded"
                )
    except AgentError as error:
        raise _fail(error) from error


@app.command()
def rollback(
    device: Annotated[str, typer.Argument()], state_dir: StateDir, config: ConfigFile = None
) -> None:
    """Restore the snapshot taken before blkpilot last changed the device."""
    from agent.applier import Applier

    cfg = _load_config(config)
    applier = Applier(cfg.paths, cfg.state_dir or state_dir)
    try:
        with applier.device_lock(device):
            restored = applier.rollback(device)
    except AgentError as error:
        raise _fail(error) from error
    typer.echo(f"restored {device}: {restored}")


@app.command()
def status(state_dir: StateDir, config: ConfigFile = None) -> None:
    """Enrollment, changes blkpilot made and whether they still hold, and the spool."""
    from agent.applier import Applier
    from agent.spool import Spool
    from agent.state import NodeState

    cfg = _load_config(config)
    directory = cfg.state_dir or state_dir
    try:
        node = NodeState.load(directory)
        typer.echo(f"node {node.node_id} ({node.hostname}) enrolled with {node.server_url}")
    except AgentError as error:
        typer.echo(str(error))
    applier = Applier(cfg.paths, directory)
    if (directory / "journal.json").exists():
        typer.echo("an interrupted change is in the journal: it is undone when the agent starts")
    for applied in sorted((directory / "applied").glob("*.json")):
        name = applied.stem
        drift = applier.drift(name)
        state = (
            "holds"
            if not drift
            else "DRIFTED: "
            + "; ".join(f"{d.attribute} is {d.actual!r}, not {d.expected!r}" for d in drift)
        )
        typer.echo(f"{name}: {applier.applied(name)} — {state}")
    spool = Spool(directory / "spool")
    rejected = len(list(spool.rejected_dir.glob("*.json"))) if spool.rejected_dir.exists() else 0
    typer.echo(
        f"spool: {len(spool.pending())} batches ({spool.size_bytes()} bytes), {rejected} rejected"
    )
