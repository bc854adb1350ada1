"""Server-side commands: serve, db, token, enrollment-token, demo.

This module imports only typer at load time; everything else is imported when a command
runs, so it can be registered on a node that has only the agent extra installed.
"""

from __future__ import annotations

import gc
import importlib.util
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from service.settings import Settings

# `serve`'s garbage collector: a young collection every 100,000 allocations (Python's default
# 700), an older one every 50 of those, a full one every 10 of those (see serve)
GC_THRESHOLDS = (100_000, 50, 10)

db_app = typer.Typer(help="Schema migrations (Alembic).", no_args_is_help=True)
enrollment_app = typer.Typer(help="One-time node enrollment tokens.", no_args_is_help=True)


def load_settings() -> Settings:
    if (
        importlib.util.find_spec("fastapi") is None
        or importlib.util.find_spec("sqlalchemy") is None
    ):
        typer.secho(
            "this command needs the server extra: pip install 'blkpilot[server]'",
            err=True,
            fg=typer.colors.RED,
        )
        raise typer.Exit(code=2)
    from pydantic import ValidationError

    from agent.contract.logs import configure as configure_logs
    from service.settings import load

    try:
        settings = load()
    except ValidationError as error:
        typer.secho(f"invalid configuration: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from error
    configure_logs(settings.log_format)
    return settings


def serve(
    host: Annotated[
        str | None, typer.Option(help="Bind address.", show_default="127.0.0.1")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port.", show_default="8000")] = None,
) -> None:
    """Run the API: upgrades the schema first; starts the embedded PostgreSQL if no URL is set."""
    settings = load_settings()
    import uvicorn

    from service.app import create_app
    from service.runtime import (
        STARTUP_FAILURE,
        Server,
        exit_cleanly_on_signals,
        open_database,
    )

    with exit_cleanly_on_signals(), open_database(settings) as database:
        app = create_app(settings, database)
        worker = None
        if settings.rollout_worker:
            from service.rollouts.worker import RolloutWorker

            worker = RolloutWorker(settings, database)
            worker.start()
        nightly = None
        if settings.nightly_worker:
            from service.recommendations.nightly_worker import NightlyWorker

            nightly = NightlyWorker(database)
            nightly.start()
        from service.telemetry.retention import MaintenanceWorker

        upkeep = MaintenanceWorker(
            database.engine, settings.retention, settings.telemetry_upkeep_seconds
        )
        upkeep.start()
        from service.tokens.listener import TokenChangeListener

        token_changes = TokenChangeListener(database.engine)
        token_changes.start()
        # what start-up allocated (the app, its routes, SQLAlchemy's metadata) is kept for
        # the process's life: out of the collector's way, so that a telemetry batch's
        # thousands of short-lived objects do not make every full collection walk it
        # (`python -m bench.ingest --batches 100`: 8.8k windows/s without, 13.7-14.0k with)
        gc.collect()
        gc.freeze()
        # and what it gathers while it runs — 10,000 nodes' tokens and device ids, kept
        # between their pushes (service.nodes.cache) — is walked less often: a push's objects
        # are short-lived and free of cycles, so Python's default (a young collection every
        # 700 allocations) spent the time on nothing. `python -m bench.fleet --intervals 3`,
        # same sitting: 2.19-2.33 → 1.67-1.79 ms of serve CPU a 48-window push, enrolment
        # 89.7-97.0 → 100-101 nodes/s (bench/results/fleet.md)
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            server = Server(
                uvicorn.Config(
                    app,
                    host=host or settings.host,
                    port=port or settings.port,
                    log_level="info",
                    log_config=None,  # uvicorn's lines through the same (JSON) handler
                    # C parsing and libuv (the server extra installs both): a telemetry push's
                    # 30-90 KB body went through h11's Python parser and asyncio's selector loop
                    loop="uvloop",
                    http="httptools",
                    access_log=False,  # RequestIdMiddleware writes one, with the request id
                    timeout_keep_alive=settings.keep_alive_seconds,
                    ssl_certfile=settings.tls_certfile,
                    ssl_keyfile=settings.tls_keyfile,
                )
            )
            server.run()
            if not server.started:  # as uvicorn.run ends: the port taken, a certificate unread
                raise SystemExit(STARTUP_FAILURE)
        finally:
            token_changes.stop()
            upkeep.stop()
            if nightly is not None:
                nightly.stop()
            if worker is not None:
                worker.stop()


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Apply migrations up to REVISION."""
    settings = load_settings()
    from service import db
    from service.runtime import database_url

    with database_url(settings) as url:
        db.upgrade(url, revision)
        typer.echo(f"schema at {revision}")


@db_app.command("downgrade")
def db_downgrade(revision: Annotated[str, typer.Argument()]) -> None:
    """Revert migrations down to REVISION ('base' drops everything)."""
    settings = load_settings()
    from service import db
    from service.runtime import database_url

    with database_url(settings) as url:
        db.downgrade(url, revision)
        typer.echo(f"schema at {revision}")


@db_app.command("current")
def db_current() -> None:
    """Show the schema's revision and the migrations' head."""
    settings = load_settings()
    from service import db
    from service.runtime import database_url

    with database_url(settings) as url:
        engine = db.create_db_engine(url)
        try:
            typer.echo(f"current: {db.current_revision(engine)}  head: {db.head_revision()}")
        finally:
            engine.dispose()


@enrollment_app.command("create")
def enrollment_create(
    label: Annotated[list[str], typer.Option(help="key=value given to the node.")] = [],  # noqa: B006
    ttl_hours: Annotated[float, typer.Option(min=0.01, max=720)] = 24.0,
) -> None:
    """Create a one-time enrollment token for a new node."""
    settings = load_settings()

    from service.cli.apiclient import labels_option
    from service.runtime import open_database
    from service.tokens import service

    labels = labels_option(label)
    with open_database(settings) as database, database.sessionmaker.begin() as session:
        _, secret = service.create_enrollment_token(
            session, "cli", labels=labels, ttl=timedelta(hours=ttl_hours)
        )
    typer.echo(secret)


def demo(
    port: Annotated[int | None, typer.Option(help="Port.", show_default="8000")] = None,
    agent_state_dir: Annotated[
        Path | None, typer.Option(help="The demo agent's state.", show_default="DATA_DIR/agent")
    ] = None,
    agent_interval: Annotated[float, typer.Option(min=0.1, help="Seconds per window.")] = 2.0,
    agent_metrics_port: Annotated[int, typer.Option(help="The local agent's /metrics.")] = 9477,
    tune_seconds: Annotated[
        float, typer.Option(min=0, help="Seconds per benchmark run of the first tuning; 0: none.")
    ] = 0.5,
) -> None:
    """The whole loop on one machine: embedded PostgreSQL, the service, three lab loop devices
    (two scratch, one holding ext4 with its own traffic) and the local agent on them; then the
    stock schedulers benchmarked on the scratch ones and the nightly job's recommendations, all
    on the dashboard."""
    import logging

    from agent.contract.logs import dressed

    settings = load_settings()
    # the service's own lines (the database's start, each migration, workers) to a file, from
    # before the first import that logs (alembic's plugins); the terminal keeps warnings,
    # errors and the demo's progress (its own logger), so the banner is not buried under them
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in root.handlers:
        handler.setLevel(logging.WARNING)
    root.addHandler(dressed(logging.FileHandler(settings.data_dir / "service.log")))
    from service.demo import run_demo

    run_demo(
        settings,
        port=port,
        agent_state_dir=agent_state_dir,
        agent_interval=agent_interval,
        agent_metrics_port=agent_metrics_port,
        tune_seconds=tune_seconds,
    )


telemetry_app = typer.Typer(help="Telemetry storage: partitions, rollups, retention.")


@telemetry_app.command("maintain")
def telemetry_maintain() -> None:
    """One upkeep pass now (serve runs one every BLKPILOT_TELEMETRY_UPKEEP_SECONDS): day
    partitions ahead, closed hours rolled up, days past the raw retention rolled up and
    dropped, months past the hourly retention dropped. Exits 1 when an hour could not be
    rolled up (the pass still moved past it), 3 when another process holds the upkeep."""
    settings = load_settings()
    from service import db
    from service.runtime import database_url
    from service.telemetry.retention import maintain

    with database_url(settings) as url:
        engine = db.create_db_engine(url, pool_size=1)
        try:
            report = maintain(engine, settings.retention)
        finally:
            engine.dispose()
    if not report.ran:
        typer.echo("another process is running a pass; nothing done")
        raise typer.Exit(code=3)
    typer.echo(
        f"created {len(report.created)} partition(s), dropped {len(report.dropped)}"
        f" ({', '.join(report.dropped) or 'none'}); {report.rolled_up} device-hour(s) rolled up;"
        f" {report.batches_forgotten} batch id(s) past retention forgotten"
    )
    if report.failed_hours:
        hours = ", ".join(f"{h:%Y-%m-%d %H:00 %Z}" for h in report.failed_hours)
        typer.echo(
            f"{len(report.failed_hours)} hour(s) could not be rolled up and were moved past"
            f" ({hours}); {report.windows_set_aside} raw window(s) set aside in"
            " telemetry_windows_set_aside; the errors are in telemetry_rollup_failures",
            err=True,
        )
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(demo)
    app.add_typer(db_app, name="db")
    from service.cli.tokens import app as token_app

    app.add_typer(token_app, name="token")
    app.add_typer(enrollment_app, name="enrollment-token")
    app.add_typer(telemetry_app, name="telemetry")
