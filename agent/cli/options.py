"""What the agent's and the bench's commands share: their options, and turning option values
into checked objects (a configuration, a workload, labels) or a clear error with exit status 2."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agent.errors import AgentError
from agent.signals import Interrupted

# The models (pydantic) are imported when an option is parsed, not when the CLI is built:
# `blkpilot --help` does not need them (bench/cli_startup.py)
if TYPE_CHECKING:
    from agent.config import AgentConfig
    from agent.contract.sli import AppSli
    from agent.contract.tunables import DeviceConfig
    from agent.contract.workloads import WorkloadSpec


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/blkpilot/agent")
    return Path.home() / ".local" / "state" / "blkpilot" / "agent"


ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="BLKPILOT_AGENT_CONFIG",
        help="The agent's TOML configuration.",
        show_default="/etc/blkpilot/agent.toml if present",
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


def fail(error: AgentError) -> typer.Exit:
    typer.secho(f"error: {error}", err=True, fg=typer.colors.RED)
    return typer.Exit(code=getattr(error, "exit_status", 1))


def sli_option(
    file: Path | None,
    url: str | None,
    metric: str | None,
    per: str | None,
    labels: list[str],
    tolerance: float,
    decides: bool = False,
) -> AppSli | None:
    """The application SLI of `--sli-file` (`--sli-decides` sets its `decides`), or of
    `--sli-url` and `--sli-metric`."""
    from pydantic import ValidationError

    from agent.contract.sli import AppSli

    if file is not None:
        try:
            found = AppSli.model_validate_json(file.read_bytes())
            return found.model_copy(update={"decides": True}) if decides else found
        except (OSError, ValidationError) as error:
            raise typer.BadParameter(str(error), param_hint="--sli-file") from error
    if url is None and metric is None:
        return None
    if url is None or metric is None:
        raise typer.BadParameter("both --sli-url and --sli-metric", param_hint="--sli-url")
    try:
        return AppSli(
            url=url,
            kind="ratio" if per else "histogram",
            metric=metric,
            per=per,
            labels=labels_option(labels),
            tolerance=tolerance,
            decides=decides,
        )
    except ValidationError as error:
        raise typer.BadParameter(str(error), param_hint="--sli-url") from error


def interrupted(stopped: Interrupted, what: str) -> typer.Exit:
    """A change stopped by a signal, after its restore: said, and the shell's status for it."""
    typer.secho(f"stopped by {stopped.name}: {what}", err=True, fg=typer.colors.YELLOW)
    return typer.Exit(code=stopped.exit_status)


def load_config(path: Path | None) -> AgentConfig:
    from pydantic import ValidationError

    from agent.config import AgentConfig

    try:
        return AgentConfig.load(path)
    except (OSError, ValidationError, ValueError) as error:
        typer.secho(f"error: configuration: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from error


def labels_option(labels: list[str]) -> dict[str, str]:
    """`--label key=value` options, or the option's error."""
    from agent.contract.labels import parse_labels

    try:
        return parse_labels(labels)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--label") from error


def parse_tunables(values: list[str]) -> dict[str, int]:
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


def device_config(
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
                "scheduler_tunables": parse_tunables(tunables),
                "nr_requests": nr_requests,
                "read_ahead_kb": read_ahead_kb,
                "completion": completion,
            }
        )
    except ValidationError as error:
        typer.secho(f"error: refused: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from error


def config_from_file(path: Path) -> DeviceConfig:
    from pydantic import ValidationError

    from agent.contract.tunables import DeviceConfig

    try:
        return DeviceConfig.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as error:
        typer.secho(f"error: refused: {path}: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from error


def candidate_option(
    config_file: Path | None,
    scheduler: str | None,
    tunables: list[str],
    nr_requests: int | None,
    read_ahead_kb: int | None,
    completion: str | None = None,
) -> DeviceConfig:
    """A whole configuration from a file, or one from the options — not both."""
    if config_file is not None:
        if scheduler or tunables or nr_requests or read_ahead_kb or completion:
            raise typer.BadParameter("either --config-file or the options, not both")
        return config_from_file(config_file)
    return device_config(scheduler, tunables, nr_requests, read_ahead_kb, completion)


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
