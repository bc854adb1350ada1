"""`blkpilot lab …`: the kernel lab."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_STATE = Path("/var/lib/blkpilot/lab")

app = typer.Typer(
    help="The kernel lab: Debian's 6.1 kernel under QEMU with scenarios.", no_args_is_help=True
)


@app.command("list")
def list_scenarios() -> None:
    """The scenarios."""
    from kernel.lab.scenarios import SCENARIOS

    for name, scenario in SCENARIOS.items():
        typer.echo(f"{name:20} modules: {', '.join(scenario.modules)}")


@app.command("run")
def run_scenario(
    scenario: Annotated[str, typer.Argument(help="See `blkpilot lab list`.")],
    rounds: Annotated[int, typer.Option(min=1, max=20)] = 2,
    seconds: Annotated[float, typer.Option(min=0.5, max=120)] = 2.0,
    report: Annotated[
        bool, typer.Option(help="Record every run as an observation of the lab node's devices.")
    ] = False,
    state_dir: Annotated[
        Path, typer.Option(help="The lab node's identity (enrolled on first --report).")
    ] = DEFAULT_STATE,
    server: Annotated[str | None, typer.Option(help="Service URL, to enroll the lab node.")] = None,
    enrollment_token: Annotated[
        str | None, typer.Option(envvar="BLKPILOT_ENROLLMENT_TOKEN", help="To enroll.")
    ] = None,
) -> None:
    """Boot the lab kernel, run the scenario, print its summary; --report stores the runs."""
    from kernel.lab import report as lab_report
    from kernel.lab.scenarios import SCENARIOS, run

    if scenario not in SCENARIOS:
        raise typer.BadParameter(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    node = lab_report.lab_node(state_dir, server, enrollment_token) if report else None
    result = run(scenario, rounds=rounds, seconds=seconds)
    shown = {k: v for k, v in asdict(result).items() if k not in ("runs", "parsed")}
    typer.echo(json.dumps(shown, indent=2, default=str))
    if node is not None:
        recorded = lab_report.report(result, node)
        typer.echo(f"recorded {recorded} observations for node {node.node_id}", err=True)
    if result.kernel_problems:
        typer.secho(
            "kernel log problems:\n" + "\n".join(result.kernel_problems),
            err=True,
            fg=typer.colors.RED,
        )
        raise typer.Exit(code=1)


@app.command("check")
def check_modules(
    build_dir: Annotated[
        Path, typer.Option(help="Where the modules are built (a scratch directory).")
    ] = DEFAULT_STATE / "check",
) -> None:
    """Our kernel modules as a reviewer reads them: each built against the lab kernel's
    headers with sparse checking every source (a warning fails), then `checkpatch.pl --strict`
    over every source. Exits 1 with the findings, 0 when both are clean."""
    from kernel.lab import build, packages

    trio = packages.select_trio()
    root = packages.fetch(trio, with_build=True)
    problems = []
    for name in build.MODULES:
        try:
            build.build_module(name, root, trio, build_dir)
        except build.BuildError as error:
            problems.append(str(error))
    problems += build.checkpatch_findings(
        build.checkpatch_script(root), [p for m in build.MODULES for p in build.module_sources(m)]
    )
    for problem in problems:
        typer.echo(problem)
    if problems:
        raise typer.Exit(code=1)
    typer.echo(f"{', '.join(build.MODULES)}: sparse and checkpatch --strict clean")
