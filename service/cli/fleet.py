"""`blkpilot devices …`, `blkpilot nodes list|revoke` and `blkpilot audit list`: the fleet as an
operator reads it, through the service's API (a viewer token is enough). Tables by default,
`--json` for scripts."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from agent.contract.owned import owned_by
from service.cli.apiclient import (
    DEFAULT_URL,
    AsJson,
    Format,
    Output,
    Reason,
    Token,
    Url,
    api,
    console,
    output_format,
    pages,
    shown_id,
)
from service.cli.policy import Device, resolve_device

devices_app = typer.Typer(help="The fleet's block devices.", no_args_is_help=True)
nodes_app = typer.Typer(help="The fleet's nodes.", no_args_is_help=True)
audit_app = typer.Typer(help="Who did what, when and why.", no_args_is_help=True)


def _table(columns: list[str], rows: list[list[str]]) -> None:
    from rich.table import Table

    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    console().print(table)


@devices_app.command("list")
def devices_list(
    url: Url = DEFAULT_URL,
    token: Token = "",
    node: Annotated[str | None, typer.Option(help="Only this node's (its host name).")] = None,
    output: Output = Format.TABLE,
    as_json: AsJson = False,
) -> None:
    """Every device, by node: class, scheduler now, whether it holds data."""
    output = output_format(output, as_json)
    hosts = {n["id"]: n["hostname"] for n in pages(url, token, "/nodes")}
    devices = [
        d for d in pages(url, token, "/devices") if node is None or hosts.get(d["node_id"]) == node
    ]
    if output is Format.JSON:
        typer.echo(json.dumps(devices, indent=2))
        return
    devices.sort(key=lambda d: (hosts.get(d["node_id"], ""), d["name"]))
    _table(
        ["id", "device", "class", "scheduler", "holds data", "present"],
        [
            [
                shown_id(d["id"], output),
                f"{hosts.get(d['node_id'], '?')}/{d['name']}",
                d["device_class"],
                d["capabilities"].get("current_scheduler") or "—",
                "yes" if d["holds_data"] else "no",
                "yes" if d["present"] else "no",
            ]
            for d in devices
        ],
    )


@devices_app.command("show")
def devices_show(
    device: Device, url: Url = DEFAULT_URL, token: Token = "", as_json: AsJson = False
) -> None:
    """One device: what it is, what it runs, its policy, and its open recommendations."""
    found = resolve_device(url, token, device)
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    hosts = {n["id"]: n["hostname"] for n in pages(url, token, "/nodes")}
    capabilities = found["capabilities"]
    holds = ", ".join(found["holds_data_reasons"])
    lines = [
        f"{hosts.get(found['node_id'], '?')}/{found['name']}  ({found['id']})",
        f"  class       {found['device_class']} ({'; '.join(found['class_evidence'])})",
        f"  model       {found['model'] or '—'} ({found['transport']})",
        f"  holds data  {'yes: ' + holds if found['holds_data'] else 'no'}",
        f"  scheduler   {capabilities.get('current_scheduler') or '—'}"
        f" (offers {', '.join(capabilities.get('available_schedulers') or [])})",
        *(f"  owned by    {owned_by(owner)}" for owner in found.get("owners") or []),
    ]
    recommendations = api(
        url,
        token,
        "GET",
        "/recommendations",
        params={"device_id": found["id"], "status": "proposed"},
    )
    assert isinstance(recommendations, list)
    for row in recommendations:
        objectives = ", ".join(row["objectives"])
        lines.append(f"  proposed    {row['id'][:8]}  {objectives} ({row.get('standing', '')})")
    for line in lines:
        typer.echo(line)


@nodes_app.command("revoke")
def nodes_revoke(
    node: Annotated[str, typer.Argument(help="The node's id, or its first 8 characters.")],
    reason: Reason,
    url: Url = DEFAULT_URL,
    token: Token = "",
) -> None:
    """Refuse a node's token at once (a host lost, or enrolled again: a re-enrolled hostname is
    a new node, and its old one keeps its token until it expires or is revoked). Its devices,
    telemetry and history stay. Admin."""
    nodes = pages(url, token, "/nodes")
    found = [n for n in nodes if n["id"] == node.lower() or n["id"].startswith(node.lower())]
    if len(node) < 4 or len(found) != 1:
        typer.secho(
            f"{len(found) if len(node) >= 4 else 'no'} node(s) match {node!r}: give its id"
            " (`blkpilot nodes list` prints the first 8 characters)",
            err=True,
            fg="red",
        )
        raise typer.Exit(code=1)
    revoked = api(url, token, "POST", f"/nodes/{found[0]['id']}/revoke", json={"reason": reason})
    assert isinstance(revoked, dict)
    typer.echo(f"node {revoked['id']} ({revoked['hostname']}) revoked at {revoked['revoked_at']}")


@nodes_app.command("list")
def nodes_list(
    url: Url = DEFAULT_URL,
    token: Token = "",
    output: Output = Format.TABLE,
    as_json: AsJson = False,
) -> None:
    """Every node: labels, agent and kernel, when it was last seen."""
    output = output_format(output, as_json)
    nodes = pages(url, token, "/nodes")
    if output is Format.JSON:
        typer.echo(json.dumps(nodes, indent=2))
        return
    _table(
        ["id", "host", "labels", "agent", "kernel", "last seen (UTC)", "revoked"],
        [
            [
                shown_id(n["id"], output),
                n["hostname"],
                ",".join(f"{k}={v}" for k, v in sorted(n["labels"].items())),
                n["agent_version"],
                n["kernel_version"],
                (n["last_seen_at"] or "never")[:19],
                "yes" if n["revoked_at"] else "",
            ]
            for n in sorted(nodes, key=lambda n: n["hostname"])
        ],
    )


@audit_app.command("list")
def audit_list(
    url: Url = DEFAULT_URL,
    token: Token = "",
    action: Annotated[
        str | None, typer.Option(help="e.g. policy.set, recommendation.accepted")
    ] = None,
    actor: Annotated[str | None, typer.Option(help="e.g. token:night-shift")] = None,
    device: Annotated[
        str | None, typer.Option(help="Only this device's (as `policy` names it).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    output: Output = Format.TABLE,
    as_json: AsJson = False,
) -> None:
    """The audit log, newest first."""
    output = output_format(output, as_json)
    params: dict[str, Any] = {"limit": limit}
    if action:
        params["action"] = action
    if actor:
        params["actor"] = actor
    if device:
        params["target_id"] = resolve_device(url, token, device)["id"]
    events = api(url, token, "GET", "/audit", params=params)
    assert isinstance(events, list)
    if output is Format.JSON:
        typer.echo(json.dumps(events, indent=2))
        return
    _table(
        ["at (UTC)", "actor", "action", "target", "detail"],
        [
            [
                e["at"][:19],
                e["actor"],
                e["action"],
                f"{e['target_type']} {shown_id(e['target_id'], output)}",
                e["detail"] if output is Format.WIDE else e["detail"][:80],
            ]
            for e in events
        ],
    )
