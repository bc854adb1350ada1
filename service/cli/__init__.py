"""The `blkpilot` command: the agent's, the bench's and the lab's commands, and the operators'
(server, recommendations, rollouts). Server commands load their heavy dependencies only when
run, so a node with only the agent extra installed gets the whole `--help` and a working agent.

- `server`: serve, db, token, enrollment-token, demo
- `recommendations`: nightly, eval, recommendations (through the API)
- `rollouts`: staged fleet rollouts (through the API)
- `apiclient`: the operators' HTTP client
"""

from __future__ import annotations

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


def main() -> None:
    from agent.progress import show_on_stderr

    show_on_stderr()  # the long steps (benchmarks, canaries, training) say where they are
    app()
