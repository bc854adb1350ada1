"""`blkpilot rollout …`: staged rollouts through the service's API (an operator token)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli.apiclient import (
    DEFAULT_URL,
    AsJson,
    Format,
    Output,
    Reason,
    Token,
    Url,
    api,
    labels_option,
    output_format,
)

app = typer.Typer(
    help="Roll a configuration out to the fleet in stages, and back.", no_args_is_help=True
)
FINAL = ("succeeded", "rolled_back", "failed")


def _summary(row: dict[str, Any]) -> str:
    stages = " → ".join(f"{s['spec']}:{s['status']}" for s in row["stages"])
    counts = ", ".join(f"{n} {status}" for status, n in sorted(row["counts"].items()))
    return (
        f"{row['id']}  {row['name']}  {row['status']}  [{stages}]  ({counts})\n"
        f"  {row['status_detail']}"
    )


@app.command()
def start(
    name: Annotated[str, typer.Option(help="A name for people.")],
    reason: Reason,
    config_file: Annotated[
        Path, typer.Option(help='The configuration as JSON, e.g. {"scheduler": "none"}.')
    ],
    device_class: Annotated[str | None, typer.Option("--class", help="e.g. nvme")] = None,
    label: Annotated[list[str], typer.Option(help="Node label key=value; repeatable.")] = [],  # noqa: B006
    device: Annotated[list[str], typer.Option(help="A device id; repeatable.")] = [],  # noqa: B006
    stages: Annotated[
        str, typer.Option(help="Cumulative: counts or percentages.")
    ] = "1,10%,50%,100%",
    serial: Annotated[str, typer.Option(help="Ansible batch size within a stage.")] = "100%",
    max_fail_percentage: Annotated[int, typer.Option(min=0, max=100)] = 0,
    soak: Annotated[float, typer.Option(help="Seconds each stage soaks.")] = 300.0,
    workload: Annotated[
        str, typer.Option(help="The canary's workload.")
    ] = "hs23-single-randread-4k-qd1",
    rounds: Annotated[
        int, typer.Option(min=3, max=100, help="Canary rounds before its first look.")
    ] = 8,
    max_rounds: Annotated[
        int | None,
        typer.Option(min=3, max=300, help="The canary's budget (default 3 x --rounds)."),
    ] = None,
    round_seconds: Annotated[float, typer.Option(min=0.1, max=600)] = 1.0,
    wait: Annotated[bool, typer.Option(help="Follow it until it ends.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = "",
) -> None:
    """Start a rollout. Exit status with --wait: 0 succeeded, 1 rolled back or failed,
    3 paused for an operator (an inconclusive canary)."""
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as error:
        raise typer.BadParameter(str(error), param_hint="--config-file") from error
    target: dict[str, Any] = {}
    if device_class:
        target["device_class"] = device_class
    if label:
        target["node_labels"] = labels_option(label)
    if device:
        target["device_ids"] = device
    body = {
        "name": name,
        "reason": reason,
        "config": config,
        "target": target,
        "stages": [s.strip() for s in stages.split(",") if s.strip()],
        "serial": serial,
        "max_fail_percentage": max_fail_percentage,
        "soak_seconds": soak,
        "canary": {
            "workload": workload,
            "rounds": rounds,
            "round_seconds": round_seconds,
            **({"max_rounds": max_rounds} if max_rounds is not None else {}),
        },
    }
    row = api(url, token, "POST", "/rollouts", json=body)
    assert isinstance(row, dict)
    typer.echo(_summary(row))
    if wait:
        raise typer.Exit(code=_follow(url, token, row["id"]))


def _follow(url: str, token: str, rollout_id: str, every: float = 2.0) -> int:
    last = ""
    while True:
        row = api(url, token, "GET", f"/rollouts/{rollout_id}")
        assert isinstance(row, dict)
        text = _summary(row)
        if text != last:
            typer.echo(text)
            last = text
        if row["status"] in FINAL:
            return 0 if row["status"] == "succeeded" else 1
        if row["status"] == "paused":
            typer.echo("paused: it waits for an operator (blkpilot rollout resume|abort)")
            return 3
        time.sleep(every)


@app.command("list")
def list_(
    status: Annotated[
        str | None, typer.Option(help="running, paused, rolling_back, succeeded, …")
    ] = None,
    output: Output = Format.TABLE,
    as_json: AsJson = False,
    url: Url = DEFAULT_URL,
    token: Token = "",
) -> None:
    """Rollouts, newest first: each one's stages and how many devices stand where."""
    rows = api(url, token, "GET", "/rollouts", params={"status": status} if status else {})
    assert isinstance(rows, list)
    if output_format(output, as_json) is Format.JSON:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        typer.echo(_summary(row))


@app.command()
def show(rollout_id: str, url: Url = DEFAULT_URL, token: Token = "") -> None:
    """Stages and every device's outcome."""
    row = api(url, token, "GET", f"/rollouts/{rollout_id}")
    assert isinstance(row, dict)
    typer.echo(_summary(row))
    for target in row["targets"]:
        first = target["detail"].splitlines()[0] if target["detail"] else ""
        typer.echo(
            f"  stage {target['stage'] + 1}  {target['hostname']}/{target['device_name']}"
            f"  {target['status']}  {first}"
        )


@app.command()
def watch(rollout_id: str, url: Url = DEFAULT_URL, token: Token = "") -> None:
    """Follow a rollout until it ends or pauses (exit 0 succeeded, 1 rolled back or failed,
    3 paused)."""
    raise typer.Exit(code=_follow(url, token, rollout_id))


def _act(action: str, rollout_id: str, reason: str, url: str, token: str) -> None:
    row = api(url, token, "POST", f"/rollouts/{rollout_id}/{action}", json={"reason": reason})
    assert isinstance(row, dict)
    typer.echo(_summary(row))


@app.command()
def pause(rollout_id: str, reason: Reason, url: Url = DEFAULT_URL, token: Token = "") -> None:
    """No new step starts; canaries under way finish."""
    _act("pause", rollout_id, reason, url, token)


@app.command()
def resume(rollout_id: str, reason: Reason, url: Url = DEFAULT_URL, token: Token = "") -> None:
    """Go on; inconclusive canaries run again."""
    _act("resume", rollout_id, reason, url, token)


@app.command()
def abort(rollout_id: str, reason: Reason, url: Url = DEFAULT_URL, token: Token = "") -> None:
    """Stop, and put back every device the rollout changed (also after it succeeded)."""
    _act("abort", rollout_id, reason, url, token)
