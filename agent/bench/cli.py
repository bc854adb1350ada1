"""`blkpilot bench …`: the papers' workloads and sweeps of them on this node."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agent.cli.options import ConfigFile, StateDir, fail, load_config, workload_option
from agent.errors import AgentError

if TYPE_CHECKING:
    from agent.bench.measure import Measurement
    from agent.contract.tunables import DeviceConfig

app = typer.Typer(
    help="Benchmarks: fio and db_bench workloads, sweeps over configurations.", no_args_is_help=True
)


@app.command("list")
def list_workloads(
    prefix: Annotated[str, typer.Argument(help="Only names starting with this.")] = "",
) -> None:
    """The named workloads (HotStorage '23, HotStorage '22, FIOS, RocksDB)."""
    from agent.bench.library import library

    for name, spec in library().items():
        if name.startswith(prefix):
            jobs = ", ".join(
                f"{j.name}: {j.pattern.value} x{j.tasks} qd{j.queue_depth}" for j in spec.jobs
            )
            typer.echo(f"{name:36} {spec.tool:8} {spec.engine.value:13} {jobs}")


@app.command()
def sweep(
    state_dir: StateDir,
    device: Annotated[
        str | None, typer.Option(help="A block device (scratch, for writes).")
    ] = None,
    directory: Annotated[Path | None, typer.Option(help="A directory on a filesystem.")] = None,
    workload: Annotated[list[str], typer.Option(help="Named workload; repeatable.")] = [],  # noqa: B006
    workload_file: Annotated[list[Path], typer.Option(help="Workload spec JSON; repeatable.")] = [],  # noqa: B006
    scheduler: Annotated[
        list[str], typer.Option(help="A configuration per scheduler; repeatable.")
    ] = [],  # noqa: B006
    config_file: Annotated[Path | None, typer.Option(help="JSON list of configurations.")] = None,
    duration: Annotated[
        float | None, typer.Option(help="Seconds per run (overrides specs).")
    ] = None,
    report: Annotated[bool, typer.Option(help="Send results to the service.")] = True,
    config: ConfigFile = None,
) -> None:
    """Run every workload under every configuration; resumes if run again after a stop."""
    from rich.progress import Progress

    from agent.applier import Applier
    from agent.bench.energy import EnergyMeter
    from agent.bench.sweep import Sweep, load_configs
    from agent.bench.target import device_target, directory_target
    from agent.contract.tunables import DeviceConfig, Scheduler
    from agent.power_sources import power_collectors

    cfg = load_config(config)
    state = cfg.state_dir or state_dir
    if (device is None) == (directory is None):
        raise typer.BadParameter("give exactly one of --device and --directory")
    specs = [workload_option(name, None) for name in workload]
    specs += [workload_option(None, path) for path in workload_file]
    if not specs:
        raise typer.BadParameter("at least one --workload or --workload-file")
    if duration is not None:
        specs = [s.model_copy(update={"duration_s": duration}) for s in specs]
    configs = [DeviceConfig(scheduler=Scheduler(s)) for s in scheduler]
    configs += load_configs(config_file) if config_file else []
    configs = configs or [DeviceConfig()]
    try:
        if device is not None:
            target = device_target(cfg.paths, device)
        else:
            assert directory is not None
            target = directory_target(directory, cfg.paths)
        runner = Sweep(
            Applier(cfg.paths, state),
            target,
            specs,
            configs,
            state_dir=state,
            meter=EnergyMeter(power_collectors(cfg)),
            send=_sender(state, target.device) if report else None,
        )
        with Progress() as bar:
            task = bar.add_task(
                "sweep",
                total=len(runner.cells),
                completed=sum(runner.done(c) for c in runner.cells),
            )

            def progress(cell: object, what: str) -> None:
                bar.update(task, description=f"{getattr(cell, 'label', '')}: {what}")
                if what == "done":
                    bar.update(task, completed=sum(runner.done(c) for c in runner.cells))

            measured = runner.run(progress)
    except AgentError as error:
        raise fail(error) from error
    typer.echo(
        f"{measured} measured now, {len(runner.cells)} in all; results in {runner.state_file}"
    )


def _sender(state: Path, device: str | None) -> Callable[[Measurement, DeviceConfig], None] | None:
    """Send results as observations, if this node is enrolled and the device is known."""
    from agent.bench.report import benchmark_observation
    from agent.errors import NotEnrolled, ServiceRejected
    from agent.state import NodeState

    try:
        node = NodeState.load(state)
    except NotEnrolled:
        return None

    def send(measurement: Measurement, config: DeviceConfig) -> None:
        with node.client() as client:
            ids = {d["name"]: d["id"] for d in client.devices(node.node_id)}
            if device not in ids:
                raise ServiceRejected(404, "not_found", f"the service does not know {device}")
            client.record_observation(
                benchmark_observation(uuid.UUID(ids[device]), measurement, config)
            )

    return send
