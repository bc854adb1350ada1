"""The `blkpilot` command: the agent's, the bench's and the lab's commands, and the operators'
(server, recommendations, rollouts). Server commands load their heavy dependencies only when
run, so a node with only the agent extra installed gets the whole `--help` and a working agent.

- `server`: serve, db, token, enrollment-token, demo
- `recommendations`: nightly, eval, recommendations (through the API)
- `rollouts`: staged fleet rollouts (through the API)
- `apiclient`: the operators' HTTP client
"""

from __future__ import annotations

import inspect
import os
from typing import Any

# click's plain help rather than rich's panels: rich's formatting cost 0.3 s of CPU on every
# --help (0.50 → 0.20 s on this machine, bench/results/cli_startup.md); set TYPER_USE_RICH=1
# for the panels. Read by typer when it is first imported: here, before it is.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer

from agent.bench.cli import app as bench_app
from agent.cli import app as agent_app
from kernel.lab.cli import app as lab_app
from service.cli.fleet import audit_app, devices_app, nodes_app
from service.cli.policy import app as policy_app
from service.cli.recommendations import register as register_learning_commands
from service.cli.rollouts import app as rollout_app
from service.cli.server import register as register_server_commands

app = typer.Typer(
    help="blkpilot: tune Linux block I/O across a fleet, with canary-proven changes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # help as wide as the terminal (click stops at 80 columns by default)
    context_settings={"max_content_width": 160},
)
app.add_typer(agent_app, name="agent")
app.add_typer(bench_app, name="bench")
app.add_typer(lab_app, name="lab")
app.add_typer(rollout_app, name="rollout")
app.add_typer(policy_app, name="policy")
app.add_typer(devices_app, name="devices")
app.add_typer(nodes_app, name="nodes")
app.add_typer(audit_app, name="audit")
register_server_commands(app)
register_learning_commands(app)


def unwrapped(text: str) -> str:
    """A docstring's paragraphs each on one line, for the help to reflow to the terminal: rich
    help keeps a docstring's own line breaks ("three lab loop devices" / "(two scratch, …" read
    as ragged lines at any width). A paragraph holding a list or an indented block is kept as
    written."""
    paragraphs = text.split("\n\n")
    for index, paragraph in enumerate(paragraphs):
        lines = paragraph.strip("\n").split("\n")
        if any(
            line[:1].isspace() or line.lstrip().startswith(("- ", "* ", "\b")) for line in lines
        ):
            continue
        paragraphs[index] = " ".join(line.strip() for line in lines)
    return "\n\n".join(paragraphs)


def unwrap_help(command: Any) -> None:  # Typer's own (vendored) click.Command
    """Every command's help, and its subcommands', unwrapped (see `unwrapped`)."""
    if command.help:
        command.help = unwrapped(inspect.cleandoc(command.help))
    for sub in getattr(command, "commands", {}).values():
        unwrap_help(sub)


def main() -> None:
    from agent.progress import show_on_stderr

    show_on_stderr()  # the long steps (benchmarks, canaries, training) say where they are
    command = typer.main.get_command(app)
    unwrap_help(command)
    command()
