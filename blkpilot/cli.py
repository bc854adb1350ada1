"""The `blkpilot` command. Server commands load their heavy dependencies only when run, so
a node with only the agent extra installed gets the whole `--help` and a working agent."""

from __future__ import annotations

import typer

from agent.bench.cli import app as bench_app
from agent.cli import app as agent_app
from blkpilot.rollouts_cli import app as rollout_app
from kernel.lab.cli import app as lab_app
from models.cli import register as register_model_commands
from service.cli import register as register_service_commands

app = typer.Typer(
    help="blkpilot: tune Linux block I/O across a fleet, with canary-proven changes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(agent_app, name="agent")
app.add_typer(bench_app, name="bench")
app.add_typer(lab_app, name="lab")
app.add_typer(rollout_app, name="rollout")
register_service_commands(app)
register_model_commands(app)


def main() -> None:
    app()
