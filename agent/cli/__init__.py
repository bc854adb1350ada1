"""`blkpilot agent …`: what runs on every node. Commands parse their options and call the
agent's modules; the heavier of those (the HTTP client, the runner, the canary's statistics)
are imported when a command runs, so `blkpilot --help` stays quick on a node."""

from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agent.cli.canary_options import (
    Alpha,
    CanaryDevice,
    CandidateFile,
    Evidence,
    GuardRatio,
    IntervalS,
    LoopKind,
    MaxInterval,
    MaxPairs,
    MaxRounds,
    MaxSeconds,
    Mode,
    NrRequests,
    Pairs,
    ReadAheadKb,
    ReportVerdict,
    Rounds,
    RoundSeconds,
    Scheduler,
    SliDecides,
    SliFile,
    SliLabel,
    SliMetric,
    SliPer,
    SliTolerance,
    SliUrl,
    Tunable,
    Workload,
    WorkloadFile,
)
from agent.cli.options import (
    ConfigFile,
    Devices,
    StateDir,
    candidate_option,
    fail,
    interrupted,
    labels_option,
    load_config,
    sli_option,
    workload_option,
)
from agent.contract import __version__
from agent.effects import Effects
from agent.errors import AgentError, ChangeFailed
from agent.fsutil import read_json, write_json_atomic
from agent.signals import Interrupted, restoring_on_signals

if TYPE_CHECKING:  # imported when a command runs: `blkpilot --help` stays quick
    from agent.canary_runs import CanaryRun

app = typer.Typer(
    help="The node agent: discovery, telemetry with power, safe sysfs changes, reporting.",
    no_args_is_help=True,
)


@app.command()
def enroll(
    server: Annotated[str, typer.Option(envvar="BLKPILOT_SERVER_URL", help="The service's URL.")],
    token: Annotated[
        str, typer.Option(envvar="BLKPILOT_ENROLLMENT_TOKEN", help="One-time enrollment token.")
    ],
    state_dir: StateDir,
    label: Annotated[list[str], typer.Option(help="key=value; repeatable.")] = [],  # noqa: B006
    hostname: Annotated[str, typer.Option(help="Name to enroll under.")] = socket.gethostname(),
    ca_bundle: Annotated[
        Path | None,
        typer.Option(
            envvar="BLKPILOT_CA_BUNDLE",
            exists=True,
            dir_okay=False,
            help="PEM CAs the service's https certificate must chain to (default: the"
            " system's); kept for every later call.",
        ),
    ] = None,
) -> None:
    """Trade a one-time enrollment token for this node's own token, kept in the state dir."""
    from agent.enrollment import enroll_node

    try:
        state = enroll_node(
            server,
            token,
            state_dir,
            hostname=hostname,
            labels=labels_option(label),
            ca_bundle=ca_bundle,
        )
    except AgentError as error:
        raise fail(error) from error
    typer.echo(f"enrolled {state.hostname} as node {state.node_id}; state in {state_dir}")


@app.command()
def heartbeat(state_dir: StateDir) -> None:
    """Tell the service this node is alive."""
    from agent.contract.wire import Heartbeat
    from agent.state import NodeState

    try:
        state = NodeState.load(state_dir)
        with state.client() as client:
            client.heartbeat(
                state.node_id,
                Heartbeat(agent_version=__version__, kernel_version=platform.release()),
            )
    except AgentError as error:
        raise fail(error) from error
    typer.echo(f"node {state.node_id}: heartbeat accepted by {state.server_url}")


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
    from rich.console import Console
    from rich.table import Table

    from agent.discovery import discover as run_discovery

    cfg = load_config(config)
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
    """Run the agent: telemetry, inventory, policies and drift, and /metrics on a local port.

    Exit status: 0 stopped by a signal; 1 could not start (the service refused, a port in
    use); 2 a bad option or configuration; 78 the node's state file is unreadable (restore it
    or re-enrol: a restart cannot help, and the systemd unit does not restart on it)."""
    from agent.daemon import run_until_signalled
    from agent.state import NodeState

    cfg = load_config(config)
    overrides = {
        "interval_s": interval,
        "push_interval_s": push_interval,
        "policy_interval_s": policy_interval,
        "metrics_port": metrics_port,
        "devices": list(device) or None,
    }
    cfg = cfg.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    directory = cfg.state_dir or state_dir
    try:
        state = None if offline else NodeState.load(directory)
        run_until_signalled(cfg, state, directory, typer.echo)
    except AgentError as error:
        raise fail(error) from error


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
    cfg = load_config(config)
    wanted = candidate_option(
        config_file, scheduler, tunable, nr_requests, read_ahead_kb, completion
    )
    from agent.applier import Applier

    applier = Applier(cfg.paths, cfg.state_dir or state_dir, Effects(dry_run=dry_run))
    try:
        # never in the middle of a canary on the device; a signal restores the snapshot
        with restoring_on_signals(), applier.device_lock(device):
            result = applier.apply(device, wanted)
    except AgentError as error:
        raise fail(error) from error
    except Interrupted as stopped:
        raise interrupted(stopped, f"{device} restored to what it had before") from None
    for path, value in applier.effects.writes:
        typer.echo(f"{'would write' if dry_run else 'wrote'} {value!r} to {path}")
    if not dry_run:
        typer.echo(f"applied to {device}; before: {result.before}")
        typer.echo(f"undo with: blkpilot agent rollback {device}")


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
    cfg = load_config(config)
    try:
        from agent.applier import Applier

        found = Applier(cfg.paths, cfg.state_dir or state_dir).current(device)
    except AgentError as error:
        raise fail(error) from error
    document = found.model_dump(mode="json", exclude_none=True)
    if out is None:
        typer.echo(json.dumps(document, sort_keys=True))
    elif keep_existing and out.exists():
        typer.echo(f"kept the earlier capture in {out}")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, document)
        typer.echo(f"captured {device} in {out}")


CANARY_COULD_NOT_RUN = 4


@app.command()
def canary(
    device: CanaryDevice,
    state_dir: StateDir,
    workload: Workload = "hs23-single-randread-4k-qd1",
    workload_file: WorkloadFile = None,
    scheduler: Scheduler = None,
    tunable: Tunable = [],  # noqa: B006
    nr_requests: NrRequests = None,
    read_ahead_kb: ReadAheadKb = None,
    config_file: CandidateFile = None,
    mode: Mode = "auto",
    rounds: Rounds = 8,
    max_rounds: MaxRounds = None,
    round_seconds: RoundSeconds = 1.0,
    pairs: Pairs = 40,
    max_pairs: MaxPairs = None,
    interval: IntervalS = 0.25,
    max_interval: MaxInterval = 10.0,
    max_seconds: MaxSeconds = 480.0,
    loop: LoopKind = "auto",
    alpha: Alpha = 0.05,
    guard_ratio: GuardRatio = 3.0,
    sli_url: SliUrl = None,
    sli_metric: SliMetric = None,
    sli_per: SliPer = None,
    sli_label: SliLabel = [],  # noqa: B006
    sli_tolerance: SliTolerance = 0.10,
    sli_decides: SliDecides = False,
    sli_file: SliFile = None,
    report: ReportVerdict = True,
    evidence: Evidence = None,
    config: ConfigFile = None,
) -> None:
    """Candidate against the current configuration, interleaved; keep it only on pass.

    Exit status: 0 pass (candidate kept); 1 fail; 3 inconclusive; 4 could not run (no eBPF,
    too little traffic, the device held or refused), the baseline restored in each; 128+N when
    stopped by signal N (SIGTERM, SIGINT, SIGHUP: the baseline is restored first)."""
    from agent.canary_runs import report_canary, run_any_canary
    from agent.live_canary import LiveSettings

    if mode not in ("auto", "synthetic", "live"):
        raise typer.BadParameter("auto, synthetic or live", param_hint="--mode")
    if loop not in ("auto", "closed", "open"):
        raise typer.BadParameter("auto, closed or open", param_hint="--loop")
    cfg = load_config(config)
    directory = cfg.state_dir or state_dir
    spec = workload_option(workload, workload_file)
    candidate = candidate_option(config_file, scheduler, tunable, nr_requests, read_ahead_kb)
    live = LiveSettings(
        sli=sli_option(
            sli_file, sli_url, sli_metric, sli_per, sli_label, sli_tolerance, sli_decides
        ),
        pairs=pairs,
        max_pairs=max_pairs,
        interval_s=interval,
        max_interval_s=max(interval, max_interval),
        max_seconds=max_seconds,
        loop=loop,  # type: ignore[arg-type]  # (checked above)
        alpha=alpha,
        guard_ratio=guard_ratio,
    )
    if max_rounds is not None and max_rounds < rounds:
        raise typer.BadParameter(f"at least --rounds ({rounds})", param_hint="--max-rounds")
    if max_pairs is not None and max_pairs < pairs:
        raise typer.BadParameter(f"at least --pairs ({pairs})", param_hint="--max-pairs")
    try:
        with restoring_on_signals():
            run = run_any_canary(
                cfg,
                directory,
                device,
                spec,
                candidate,
                mode=mode,  # type: ignore[arg-type]
                rounds=rounds,
                max_rounds=max_rounds,
                round_seconds=round_seconds,
                alpha=alpha,
                live=live,
            )
    except Interrupted as stopped:
        raise interrupted(stopped, f"no verdict; {device} restored to its baseline") from None
    except ChangeFailed as error:  # a restore that failed: the device is not as it was
        raise fail(error) from error
    except AgentError as error:
        typer.secho(f"could not run: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=CANARY_COULD_NOT_RUN) from error
    if evidence is not None:
        write_json_atomic(evidence, run.evidence(device, candidate))
    _say_verdict(run)
    if report:
        try:
            typer.echo(report_canary(directory, device, candidate, run))
        except AgentError as error:
            typer.secho(
                f"verdict not sent to the service: {error}", err=True, fg=typer.colors.YELLOW
            )
    raise typer.Exit(code={"pass": 0, "fail": 1, "inconclusive": 3}[run.result.verdict.value])


def _say_verdict(run: CanaryRun) -> None:
    """A canary's statistics (a JSON line per metric), its notes, and the verdict's line."""
    from agent.canary import describe

    result = run.result
    for row in describe(result):
        typer.echo(json.dumps(row))
    for note in result.notes:
        typer.echo(f"note: {note}")
    kind = "live" if run.live is not None else "synthetic"
    outcome = "candidate kept" if result.kept_candidate else "baseline restored"
    counted = "pairs" if kind == "live" else "rounds"
    typer.echo(
        f"verdict: {result.verdict.value} ({kind}) after {result.rounds} {counted}"
        f" ({result.looks} look{'s' if result.looks > 1 else ''}) in"
        f" {result.seconds:.1f} s; {outcome}"
    )


@app.command()
def canaries(
    state_dir: StateDir,
    run: Annotated[bool, typer.Option("--run", help="Run them (else only list).")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, best first.")] = 1,
    rounds: Annotated[int, typer.Option(min=3, max=100, help="Rounds before the first look.")] = 8,
    max_rounds: Annotated[
        int | None,
        typer.Option(min=3, max=300, help="The budget (default 3 x --rounds)."),
    ] = None,
    round_seconds: Annotated[float, typer.Option(min=0.1, max=600)] = 1.0,
    config: ConfigFile = None,
) -> None:
    """The canaries the nightly job scheduled on this node's devices. With --run, each is a
    measurement: candidate against the device's configuration, interleaved, the verdict and
    statistics recorded; the device then returns to its configuration whatever the verdict
    (the operator decides through the recommendations), and the canary is closed."""
    from agent.canary_runs import scheduled_canaries

    cfg = load_config(config)
    directory = cfg.state_dir or state_dir
    try:
        found = scheduled_canaries(
            cfg,
            directory,
            typer.echo,
            run=run,
            limit=limit,
            rounds=rounds,
            max_rounds=max_rounds,
            round_seconds=round_seconds,
        )
    except AgentError as error:
        raise fail(error) from error
    if not found:
        typer.echo("no canaries scheduled for this node")


@app.command()
def rollback(
    device: Annotated[str, typer.Argument()], state_dir: StateDir, config: ConfigFile = None
) -> None:
    """Restore the snapshot taken before blkpilot last changed the device. Where a policy
    asks for the change, it is paused on this node — not re-applied, not reported as drift,
    shown as paused — until the policy changes or `blkpilot agent resume DEVICE`."""
    from agent.state import PausedPolicies

    cfg = load_config(config)
    directory = cfg.state_dir or state_dir
    from agent.applier import Applier

    applier = Applier(cfg.paths, directory)
    try:
        with applier.device_lock(device):
            restored = applier.rollback(device)
    except AgentError as error:
        raise fail(error) from error
    typer.echo(f"restored {device}: {restored}")
    versions = directory / "policies.json"
    version = read_json(versions).get(device) if versions.exists() else None
    if version is not None:
        who = os.environ.get("SUDO_USER") or os.environ.get("USER") or "an operator"
        PausedPolicies(directory).pause(device, int(version), f"rolled back by hand by {who}")
        typer.echo(
            f"{device}'s policy (v{version}) is paused on this node until it changes, or"
            f" `blkpilot agent resume {device}`"
        )


@app.command()
def resume(
    device: Annotated[str, typer.Argument()], state_dir: StateDir, config: ConfigFile = None
) -> None:
    """End a pause a hand rollback put on the device's policy: the agent applies it again."""
    from agent.state import PausedPolicies

    cfg = load_config(config)
    if not PausedPolicies(cfg.state_dir or state_dir).resume(device):
        raise fail(AgentError(f"{device}'s policy is not paused"))
    typer.echo(f"resumed {device}: the agent applies its policy at its next sync")


@app.command()
def release(
    device: Annotated[str, typer.Argument(help="A device, or * for a hold on every device.")],
    state_dir: StateDir,
    config: ConfigFile = None,
) -> None:
    """Let blkpilot change a device again after an unreadable journal held it (check the
    device's queue settings and the journal set aside in the state directory first)."""
    cfg = load_config(config)
    from agent.applier import Applier

    applier = Applier(cfg.paths, cfg.state_dir or state_dir)
    if not applier.release(device):
        raise fail(AgentError(f"{device} is not held"))
    typer.echo(f"released {device}")


@app.command()
def status(state_dir: StateDir, config: ConfigFile = None) -> None:
    """Enrollment, changes blkpilot made and whether they still hold, and the spool."""
    from agent.status import node_status

    cfg = load_config(config)
    for line in node_status(cfg, cfg.state_dir or state_dir):
        typer.echo(line)
