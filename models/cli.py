"""`blkpilot nightly` and `blkpilot eval`. Loaded lazily, like the other server commands."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from models.nightly import NightlyReport

DEFAULT_GRID = Path(__file__).resolve().parent.parent / "bench/results/policy_grid_runs.json.gz"


def nightly(
    objective: Annotated[
        list[str] | None,
        typer.Option(help="Objectives to train and recommend for [default: all with data]."),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(envvar="RAY_ADDRESS", help="A Ray cluster; unset: a local Ray."),
    ] = None,
    window_hours: Annotated[
        float, typer.Option(min=0.1, help="Telemetry that says what a device runs.")
    ] = 24.0,
    max_canaries: Annotated[int, typer.Option(min=0, help="Canaries to schedule.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Retrain on every observation, re-score every device's recommendations and schedule
    canaries for the most promising or most uncertain cells — on Ray."""
    from sqlalchemy.orm import Session

    from models import nightly as job
    from models.priors import Objective
    from service import db
    from service.cli import _settings
    from service.runtime import database_url

    settings = _settings()
    try:
        objectives = [Objective(o) for o in objective] if objective else list(Objective)
    except ValueError as error:
        known = ", ".join(o.value for o in Objective)
        raise typer.BadParameter(f"{error}; objectives are {known}") from error
    with database_url(settings) as url:
        engine = db.create_db_engine(url, pool_size=2, max_overflow=0)
        try:
            with Session(engine) as session, session.begin():
                report = job.run(session, objectives=objectives, ray_address=ray_address,
                                 window=timedelta(hours=window_hours),
                                 max_canaries=max_canaries)  # fmt: skip
        finally:
            engine.dispose()
    if as_json:
        typer.echo(json.dumps(_report_json(report), indent=2, default=str))
        return
    typer.echo(f"nightly run {report.run_id} on {report.where}: {report.samples} observations")
    for model in report.models:
        typer.echo(f"  model {model['device_class']}/{model['objective']}: {model['rows']} rows,"
                   f" typical error {model.get('typical_error', '-')},"
                   f" 80 % interval coverage {model.get('interval_80_coverage', '-')}")  # fmt: skip
    typer.echo(f"  {report.recommendations} recommendations ({report.changes} would change"
               f" something), {len(report.canaries)} canaries scheduled")  # fmt: skip
    for name, why in sorted(report.skipped.items()):
        typer.echo(f"  skipped {name}: {why}")


def _report_json(report: NightlyReport) -> dict[str, object]:
    from dataclasses import asdict

    return asdict(report)


def evaluate(
    grid: Annotated[Path, typer.Option(help="A measured grid (bench/policy_grid.py).")] = (
        DEFAULT_GRID
    ),
    objective: Annotated[list[str] | None, typer.Option(help="[default: all]")] = None,
    max_canaries: Annotated[int, typer.Option(min=0)] = 4,
    ray_address: Annotated[str | None, typer.Option(envvar="RAY_ADDRESS")] = None,
    local: Annotated[bool, typer.Option(help="Without Ray, one cell after another.")] = False,
    output: Annotated[Path | None, typer.Option(help="Write every cell's result here.")] = None,
) -> None:
    """Hold each cell of the grid out in turn, recommend with up to MAX_CANARIES canaries,
    and report the regret against the oracle and against the fixed rules."""
    import gzip

    from models import evaluate as ev
    from models.grid import Grid
    from models.priors import Objective

    if not grid.exists():
        raise typer.BadParameter(f"{grid} does not exist; measure one: python bench/policy_grid.py")
    opener = gzip.open if grid.suffix == ".gz" else open
    with opener(grid, "rt") as handle:
        measured = Grid.from_json(json.load(handle))
    objectives = [Objective(o) for o in objective] if objective else None
    if local:
        reports = ev.evaluate(measured, objectives, max_canaries=max_canaries)
    else:
        from models.distributed import ray_map, ray_session

        with ray_session(ray_address):
            reports = ev.evaluate(measured, objectives, max_canaries=max_canaries, mapper=ray_map)
    summary = {name: report.summary() for name, report in reports.items()}
    if output is not None:
        output.write_text(json.dumps(ev.as_json(reports), indent=2) + "\n")
    typer.echo(json.dumps(summary, indent=2))
    if not all(s["beats_every_baseline"] for s in summary.values()):
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command()(nightly)
    app.command("eval")(evaluate)
