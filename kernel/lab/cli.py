"""`blkpilot lab …`: the kernel lab."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

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
) -> None:
    """Boot the lab kernel, run the scenario, print its summary (and the runs with --json)."""
    from kernel.lab.scenarios import SCENARIOS, run

    if scenario not in SCENARIOS:
        raise typer.BadParameter(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    result = run(scenario, rounds=rounds, seconds=seconds)
    shown = {k: v for k, v in asdict(result).items() if k not in ("runs", "parsed")}
    typer.echo(json.dumps(shown, indent=2))
    if result.kernel_problems:
        typer.secho(
            "kernel log problems:\n" + "\n".join(result.kernel_problems),
            err=True,
            fg=typer.colors.RED,
        )
        raise typer.Exit(code=1)
