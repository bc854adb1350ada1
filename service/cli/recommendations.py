"""`blkpilot nightly`, `blkpilot eval` and `blkpilot recommendations`: the learning side for
operators. Heavy imports happen when a command runs, like the other server commands."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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
    console,
    output_format,
    pages,
    resolve_id,
    shown_id,
)

if TYPE_CHECKING:
    from models.priors import Objective
    from service.recommendations.nightly import NightlyReport

DEFAULT_GRID = Path(__file__).resolve().parents[2] / "bench/results/policy_grid_runs.json.gz"


def nightly(
    objective: Annotated[
        list[str] | None,
        typer.Option(help="Objectives to train and recommend for.", show_default="all with data"),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(envvar="RAY_ADDRESS", help="A Ray cluster; unset: a local Ray."),
    ] = None,
    window_hours: Annotated[
        float, typer.Option(min=0.1, help="Telemetry that says what a device runs.")
    ] = 24.0,
    max_canaries: Annotated[int, typer.Option(min=0, help="Canaries to schedule.")] = 10,
    mix: Annotated[
        str | None,
        typer.Option(help="Also recommend for a weighted mix, e.g. p99_latency=0.7,energy=0.3."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    local: Annotated[
        bool,
        typer.Option(help="In this process, without Ray: where Ray cannot start (a busy host)."),
    ] = False,
    url: Annotated[
        str | None,
        typer.Option(
            help="Queue it in this blkpilot service (an admin token) instead of running it on"
            " the database here; it runs on the service's Ray, or with --local in its process.",
            show_default="run here",
        ),
    ] = None,
    token: Token = "",
    wait: Annotated[
        bool, typer.Option(help="With --url: follow the run until it ends (exit 1 if it fails).")
    ] = True,
) -> None:
    """Retrain on every observation, re-score every device's recommendations and schedule
    canaries for the most promising or most uncertain cells — on Ray, or with --local here;
    with --url, in a service (POST /api/v1/nightly-runs)."""
    from models.priors import Objective

    try:
        objectives = [Objective(o) for o in objective] if objective else list(Objective)
    except ValueError as error:
        known = ", ".join(o.value for o in Objective)
        raise typer.BadParameter(f"{error}; objectives are {known}") from error
    weights = _mix(mix) if mix else None
    if url is not None:
        body = {
            "objectives": [o.value for o in objectives] if objective else None,
            "window_hours": window_hours,
            "max_canaries": max_canaries,
            "mix": {k.value: v for k, v in weights.items()} if weights else None,
            "local": local,
        }
        _nightly_through(url, token, body, wait=wait, as_json=as_json)
        return
    from service.cli.server import load_settings
    from service.recommendations import nightly as job

    settings = load_settings()
    report = job.run_in_database(
        settings,
        objectives=objectives,
        ray_address=ray_address,
        window=timedelta(hours=window_hours),
        max_canaries=max_canaries,
        mix=weights,
        local=local,
    )
    found = json.loads(json.dumps(_report_json(report), default=str))
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    _print_report(found)


def _nightly_through(
    url: str, token: str, body: dict[str, Any], *, wait: bool, as_json: bool
) -> None:
    """Queues the run in the service and, with `wait`, follows it: queued, running (how long),
    then its report — as the in-process command prints it — or why it failed (exit 1)."""
    import time

    run = api(url, token, "POST", "/nightly-runs", json=body)
    assert isinstance(run, dict)
    typer.echo(f"nightly run {run['id']} queued in {url}", err=True)
    said = run["status"]
    while wait and run["status"] in ("queued", "running"):
        time.sleep(2.0)
        run = api(url, token, "GET", f"/nightly-runs/{run['id']}")
        assert isinstance(run, dict)
        if run["status"] != said:
            said = run["status"]
            typer.echo(f"nightly run {run['id']}: {said}", err=True)
    if as_json or not wait:
        typer.echo(json.dumps(run, indent=2))
    if run["status"] == "failed":
        typer.secho(f"nightly run {run['id']} failed: {run['error']}", err=True, fg="red")
        raise typer.Exit(code=1)
    if wait and not as_json:
        _print_report(run["report"])


def _print_report(report: dict[str, Any]) -> None:
    typer.echo(
        f"nightly run {report['run_id']} on {report['where']}: {report['samples']} observations"
    )
    for model in report["models"]:
        typer.echo(
            f"  model {model['device_class']}/{model['objective']}: {model['rows']} rows,"
            f" typical error {model.get('typical_error', '-')},"
            f" 80 % interval coverage {model.get('interval_80_coverage', '-')}"
        )
    typer.echo(
        f"  {report['recommendations']} recommendations ({report['changes']} would change"
        f" something), {len(report['canaries'])} canaries scheduled"
    )
    for name, why in sorted(report["skipped"].items()):
        typer.echo(f"  skipped {name}: {why}")


def _mix(text: str) -> dict[Objective, float]:
    from models.priors import Objective

    weights = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            weights[Objective(name.strip())] = float(value)
        except ValueError as error:
            raise typer.BadParameter(
                f"{part!r}: expected objective=weight, objectives "
                + ", ".join(o.value for o in Objective)
            ) from error
        if not weights[Objective(name.strip())] > 0:
            raise typer.BadParameter(f"{part!r}: a weight must be positive")
    return weights


def _report_json(report: NightlyReport) -> dict[str, object]:
    from dataclasses import asdict

    return asdict(report)


def evaluate(
    grid: Annotated[
        list[Path] | None,
        typer.Option(
            help="A measured grid (bench/policy_grid.py); repeat it to judge several as one.",
            show_default=str(DEFAULT_GRID.relative_to(DEFAULT_GRID.parents[2])),
        ),
    ] = None,
    objective: Annotated[
        list[str] | None, typer.Option(help="Objectives to judge.", show_default="all")
    ] = None,
    max_canaries: Annotated[int, typer.Option(min=0)] = 4,
    holdout: Annotated[
        str,
        typer.Option(
            help="What the models have not seen: a cell, a whole device, or a whole workload."
        ),
    ] = "cell",
    seeds: Annotated[int, typer.Option(min=1, help="Runs with other random states.")] = 1,
    ray_address: Annotated[str | None, typer.Option(envvar="RAY_ADDRESS")] = None,
    local: Annotated[bool, typer.Option(help="Without Ray, one cell after another.")] = False,
    output: Annotated[Path | None, typer.Option(help="Write every cell's result here.")] = None,
) -> None:
    """Hold each cell (or device, or workload) of the grid out in turn, recommend with up to
    MAX_CANARIES replayed canaries, and report the regret against the oracle and against the
    fixed rules — the model's pick before any canary, and the kept choice after 1, 2 and 4."""
    from models import evaluate as ev
    from models.grid import Grid
    from models.priors import Objective

    if holdout not in ev.HOLDOUTS:
        raise typer.BadParameter(f"--holdout must be one of {', '.join(ev.HOLDOUTS)}")
    grids = grid or [DEFAULT_GRID]
    for path in grids:
        if not path.exists():
            raise typer.BadParameter(
                f"{path} does not exist; measure one: python -m bench.policy_grid"
            )
    try:
        measured = Grid.load_all(grids)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    objectives = [Objective(o) for o in objective] if objective else None
    if local:
        reports = ev.evaluate(
            measured, objectives, max_canaries=max_canaries, holdout=holdout, seeds=seeds
        )
    else:
        from models.distributed import ray_map, ray_session

        with ray_session(ray_address):
            reports = ev.evaluate(
                measured,
                objectives,
                max_canaries=max_canaries,
                holdout=holdout,
                seeds=seeds,
                mapper=ray_map,
            )
    summary = {name: report.summary() for name, report in reports.items()}
    if output is not None:
        output.write_text(json.dumps(ev.as_json(reports), indent=2) + "\n")
    typer.echo(json.dumps(summary, indent=2))
    if not all(s["beats_every_baseline"] for s in summary.values()):
        raise typer.Exit(code=1)


# --- operators' side: recommendations through the REST API ---------------------------------

recommendations_app = typer.Typer(
    help="Recommendations from the nightly job, through the API: list, show, accept, reject.",
    no_args_is_help=True,
)


def _key(config: dict[str, object] | None) -> str:
    from agent.contract.tunables import DeviceConfig
    from models.features import config_label

    return config_label(DeviceConfig.model_validate(config)) if config else "-"


@recommendations_app.command("list")
def recommendations_list(
    url: Url = DEFAULT_URL,
    token: Token = "",
    status: Annotated[str | None, typer.Option(help="proposed, accepted, rejected …")] = "proposed",
    device_id: Annotated[str | None, typer.Option()] = None,
    output: Output = Format.TABLE,
    as_json: AsJson = False,
) -> None:
    """Current against recommended configuration, the objectives it serves, the predicted
    gain (improvement, + is better, 80 % interval), the ensemble's agreement (how settled the
    ranking is) and its standing (predicted, proven, unproven or refuted by its canary)."""
    from rich.table import Table

    params = {k: v for k, v in {"status": status, "device_id": device_id}.items() if v}
    output = output_format(output, as_json)
    rows = api(url, token, "GET", "/recommendations", params=params)
    assert isinstance(rows, list)
    if output is Format.JSON:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(
        "id",
        "device",
        "objective",
        "workload",
        "current",
        "recommended",
        "predicted gain (80 % interval), + is better",
        "agreement",
        "status",
        "standing",
    )
    # devices by name, as the dashboard shows them: node/device
    hosts = {n["id"]: n["hostname"] for n in pages(url, token, "/nodes")}
    devices = pages(url, token, "/devices")
    names = {d["id"]: f"{hosts.get(d['node_id'], '?')}/{d['name']}" for d in devices}
    for row in rows:
        prediction = row["predictions"].get(row["objective"], {})
        change = gain_text(prediction) if prediction else "-"
        table.add_row(
            shown_id(row["id"], output),
            names.get(row["device_id"], row["device_id"][:8]),
            ", ".join(row.get("objectives") or [row["objective"]]),
            row["workload_name"],
            _key(row["current_config"]),
            _key(row["recommended_config"]),
            change,
            f"{row['confidence']:.0%}",
            row["status"],
            row.get("standing", ""),
        )
    console().print(table)


def gain_text(prediction: dict[str, float]) -> str:
    """A prediction's gain as every view shows it: improvement, higher is better, with its
    80 % interval (latency 45 % lower: +45.0 %)."""
    return (
        f"{prediction['gain']:+.1%} ({prediction['gain_low']:+.1%}"
        f" … {prediction['gain_high']:+.1%})"
    )


RecommendationId = Annotated[
    str, typer.Argument(help="Its id, or the first characters of it that `list` shows.")
]


def _resolve(url: str, token: str, given: str) -> str:
    return resolve_id(url, token, "/recommendations", given, "recommendation")


@recommendations_app.command("show")
def recommendations_show(
    recommendation_id: RecommendationId,
    url: Url = DEFAULT_URL,
    token: Token = "",
    as_json: Annotated[bool, typer.Option("--json", help="The API's JSON as it is.")] = False,
) -> None:
    """One recommendation: its device, the change, every objective's predicted gain (with
    its unit and interval), its canary's measured gain, and why."""
    full = _resolve(url, token, recommendation_id)
    row = api(url, token, "GET", f"/recommendations/{full}")
    assert isinstance(row, dict)
    if as_json:
        typer.echo(json.dumps(row, indent=2))
        return
    device = api(url, token, "GET", f"/devices/{row['device_id']}")
    assert isinstance(device, dict)
    for line in describe_recommendation(row, device):
        typer.echo(line)


def describe_recommendation(row: dict[str, Any], device: dict[str, Any]) -> list[str]:
    """A recommendation as an operator reads it, in the dashboard's figures and words."""
    lines = [
        f"recommendation {row['id']}  ({row['status']}, {row.get('standing', '')})",
        f"device      {device.get('name', row['device_id'])} ({device.get('device_class', '')})",
        f"workload    {row['workload_name']}  ({row['workload_basis']})",
        f"change      {_key(row['current_config'])} -> {_key(row['recommended_config'])}",
        f"objectives  {', '.join(row['objectives'])}; agreement {row['confidence']:.0%}"
        " (the ensemble members ranking it first: how settled, not the chance it helps)",
        "predicted   (gain: improvement, + is better; 80 % interval)",
    ]
    for name, p in row["predictions"].items():
        unit = p.get("unit", "")
        lines.append(
            f"  {name:<18} now {p['current']:.4g} {unit} -> {p['recommended']:.4g} {unit}:"
            f" gain {gain_text(p)}"
        )
    canary = row.get("canary")
    if canary:
        lines.append(f"canary      {canary['verdict']} on {canary['finished_at']}")
        for effect in canary["effects"].values():
            lines.append(
                f"  {effect['label']:<18} measured gain {gain_text(effect)}"
                f" (baseline {effect['baseline']:.4g} {effect['unit']})"
            )
    lines.append(f"why         {row['reason']}")
    if row.get("decided_by"):
        lines.append(
            f"decided     {row['status']} by {row['decided_by']}: {row['decision_reason']}"
        )
    return lines


@recommendations_app.command("accept")
def recommendations_accept(
    recommendation_id: RecommendationId,
    reason: Reason,
    without_canary: Annotated[
        bool,
        typer.Option(
            "--without-canary",
            help="pin it at once with no canary (an audited choice) instead of trying it",
        ),
    ] = False,
    on_inconclusive: Annotated[
        str, typer.Option(help="roll_back (default) or pause: what an inconclusive canary does")
    ] = "roll_back",
    soak_seconds: Annotated[
        float, typer.Option(help="after the canary passed, how long the guardrails watch")
    ] = 300.0,
    url: Url = DEFAULT_URL,
    token: Token = "",
) -> None:
    """Try the recommended configuration on its device under a canary and keep it only if it
    holds (a one-device rollout: follow it with `blkpilot rollout watch`); the device's other
    open recommendations are superseded, and this says which."""
    full = _resolve(url, token, recommendation_id)
    body: dict[str, object] = {"reason": reason, "without_canary": without_canary}
    if not without_canary:
        body |= {"on_inconclusive": on_inconclusive, "soak_seconds": soak_seconds}
    row = api(url, token, "POST", f"/recommendations/{full}/accept", json=body)
    assert isinstance(row, dict)
    if row["status"] == "applied":
        typer.echo(f"applied without a canary: {_key(row['recommended_config'])} is the policy")
    else:
        typer.echo(
            f"verifying: {_key(row['recommended_config'])} is tried under a canary by rollout"
            f" {row['rollout_id']}; kept only if it passes"
        )
    for other in row.get("superseded") or []:
        typer.echo(f"superseded: {other[:8]} (another recommendation for this device)")


@recommendations_app.command("revert")
def recommendations_revert(
    recommendation_id: RecommendationId, reason: Reason, url: Url = DEFAULT_URL, token: Token = ""
) -> None:
    """Undo it in one step: the device goes back to exactly what it had before (unmanaged if
    it was unmanaged), audited."""
    full = _resolve(url, token, recommendation_id)
    api(url, token, "POST", f"/recommendations/{full}/revert", json={"reason": reason})
    typer.echo("reverted: the device goes back to what it had before this change")


@recommendations_app.command("reject")
def recommendations_reject(
    recommendation_id: RecommendationId, reason: Reason, url: Url = DEFAULT_URL, token: Token = ""
) -> None:
    """Decline it (audited, with the reason); the device keeps what it runs."""
    full = _resolve(url, token, recommendation_id)
    api(url, token, "POST", f"/recommendations/{full}/reject", json={"reason": reason})
    typer.echo("rejected")


def register(app: typer.Typer) -> None:
    app.command()(nightly)
    app.command("eval")(evaluate)
    app.add_typer(recommendations_app, name="recommendations")
