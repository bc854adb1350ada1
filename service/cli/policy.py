"""`blkpilot policy …`: a device's desired configuration — show, set, revert, clear — through
the service's API (an operator token; a viewer's reads). A device is named by its id, the
first characters of it, its name where that is unique, or HOST/NAME."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from service.cli.apiclient import DEFAULT_URL, Reason, Token, Url, api, pages

app = typer.Typer(help="A device's policy: show, set, revert, clear.", no_args_is_help=True)
Device = Annotated[
    str, typer.Argument(help="A device: its id (or its start), its name, or HOST/NAME.")
]


def resolve_device(url: str, token: str, given: str) -> dict[str, Any]:
    """The one device `given` names; exit status 1, saying why and which, for none or
    several."""
    devices = pages(url, token, "/devices")
    host, _, name = given.rpartition("/")
    if host:
        hosts = {n["id"]: n["hostname"] for n in pages(url, token, "/nodes")}
        found = [d for d in devices if d["name"] == name and hosts.get(d["node_id"]) == host]
    else:
        found = [d for d in devices if d["id"] == given.lower()]
        found = found or [d for d in devices if d["name"] == given]
        if not found and len(given) >= 4:
            found = [d for d in devices if d["id"].startswith(given.lower())]
    if len(found) == 1:
        return found[0]
    if not found:
        typer.secho(f"no device {given!r}", err=True, fg="red")
    else:
        nodes = {n["id"]: n for n in pages(url, token, "/nodes")}
        named = "\n".join(
            f"  {d['id'][:8]}  {_where(nodes.get(d['node_id']), d['name'])}" for d in found[:10]
        )
        typer.secho(
            f"{len(found)} devices are {given!r}; say which by id (its first 8 characters"
            f" will do):\n{named}",
            err=True,
            fg="red",
        )
    raise typer.Exit(code=1)


def _where(node: dict[str, Any] | None, name: str) -> str:
    """HOST/NAME with the node's id and when it enrolled: a hostname enrolled twice (a
    re-installed server, say) is two nodes, told apart by these."""
    if node is None:
        return f"?/{name}"
    enrolled = node.get("enrolled_at") or node.get("created_at") or "?"
    return f"{node['hostname']}/{name}  (node {node['id'][:8]}, enrolled {enrolled})"


def _label(config: dict[str, Any]) -> str:
    tunables = ",".join(
        f"{k}={v}" for k, v in sorted((config.get("scheduler_tunables") or {}).items())
    )
    completion = config.get("completion") or "interrupt"
    return f"{config.get('scheduler') or 'unchanged'}[{tunables}]/{completion}"


def _print(policy: dict[str, Any]) -> None:
    applied = policy.get("applied") or {}
    state = (
        f"{applied['status']} v{applied['version']} at {applied['at']}"
        if applied
        else "not yet applied"
    )
    typer.echo(f"{policy['device_name']}: {_label(policy['config'])}  v{policy['version']}")
    typer.echo(f"  set by {policy['set_by']}: {policy['reason']}")
    if policy.get("owners") == "yield":
        typer.echo("  yields to the device's other owners (udev, TuneD)")
    typer.echo(f"  on the node: {state}{'' if policy['in_sync'] else ' (not in sync)'}")
    if applied.get("status") == "yielded":
        typer.echo(f"  {applied['detail']}")


@app.command()
def show(
    device: Device,
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The device's policy and what its node last reported applying."""
    found = resolve_device(url, token, device)
    policy = api(url, token, "GET", f"/devices/{found['id']}/policy")
    assert isinstance(policy, dict)
    if as_json:
        typer.echo(json.dumps(policy, indent=2))
    else:
        _print(policy)


@app.command("set")
def set_(
    device: Device,
    reason: Reason,
    scheduler: Annotated[str, typer.Option(help="none, mq-deadline, kyber, bfq or fios.")],
    tunable: Annotated[
        list[str], typer.Option(help="A scheduler tunable name=value; repeatable.")
    ] = [],  # noqa: B006
    owners: Annotated[
        str,
        typer.Option(
            help="Where a udev rule or TuneD profile sets the same attribute: take_over (apply,"
            " and again once per change it makes) or yield (its setting stands).",
        ),
    ] = "take_over",
    url: Url = DEFAULT_URL,
    token: Token = "",
) -> None:
    """Set the device's desired configuration (audited; refused if it cannot take it)."""
    tunables: dict[str, int] = {}
    for item in tunable:
        name, _, value = item.partition("=")
        try:
            tunables[name.strip()] = int(value)
        except ValueError as error:
            raise typer.BadParameter(f"{item!r}: expected name=integer") from error
    found = resolve_device(url, token, device)
    config = {"scheduler": scheduler, "scheduler_tunables": tunables}
    policy = api(
        url,
        token,
        "PUT",
        f"/devices/{found['id']}/policy",
        json={"config": config, "reason": reason, "owners": owners},
    )
    assert isinstance(policy, dict)
    _print(policy)


@app.command()
def revert(device: Device, reason: Reason, url: Url = DEFAULT_URL, token: Token = "") -> None:
    """Back to the configuration before the current version (the previous version's, or what
    the device ran before its first policy): a new version, audited."""
    found = resolve_device(url, token, device)
    policy = api(
        url, token, "POST", f"/devices/{found['id']}/policy/revert", json={"reason": reason}
    )
    assert isinstance(policy, dict)
    _print(policy)


@app.command()
def clear(device: Device, reason: Reason, url: Url = DEFAULT_URL, token: Token = "") -> None:
    """No policy for the device (audited): it keeps what it runs, and nothing enforces it."""
    found = resolve_device(url, token, device)
    api(url, token, "DELETE", f"/devices/{found['id']}/policy", params={"reason": reason})
    typer.echo(f"{found['name']}: policy cleared; the device keeps what it runs")
