"""The nightly worker thread that `blkpilot serve` runs beside the API: it claims the nightly
runs operators queue (`POST /api/v1/nightly-runs`, `blkpilot nightly --url`), runs each as
`blkpilot nightly` would on the service's database, and stores its report or why it failed."""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.db import Database
from service.recommendations import repository

log = logging.getLogger(__name__)


class NightlyWorker:
    def __init__(self, database: Database, poll_seconds: float = 2.0) -> None:
        self.database, self.poll = database, poll_seconds
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="nightly-worker", daemon=True)

    def start(self) -> None:
        self.recover()
        self.thread.start()

    def recover(self) -> int:
        """Runs a stopped service left running are failed, with why (their transaction was
        rolled back with the process: nothing of them was stored)."""
        with Session(self.database.engine) as session, session.begin():
            left = repository.abandon_running_nightly_runs(
                session, datetime.now(UTC), "the service stopped while it ran; queue it again"
            )
        if left:
            log.warning("nightly worker: %d run(s) left running by a stopped service failed", left)
        return left

    def stop(self, timeout: float = 10.0) -> None:
        """Stops claiming; a run under way finishes in its thread (a daemon: a service that
        exits ends it, and the next start marks it failed)."""
        self.stopping.set()
        self.thread.join(timeout)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                if not self.run_one():
                    self.stopping.wait(self.poll)
            except Exception:
                log.exception("nightly worker: a step failed; retrying")
                self.stopping.wait(max(self.poll, 5.0))

    def run_one(self) -> bool:
        """Claims and runs the oldest queued run; False if there was none."""
        with Session(self.database.engine) as session, session.begin():
            run = repository.claim_nightly_run(session, datetime.now(UTC))
            if run is None:
                return False
            run_id, options = run.id, dict(run.options)
        log.info("nightly worker: run %s started (%s)", run_id, options)
        try:
            report = self._run(options)
        except Exception as error:  # the job's own failure is the run's outcome, not ours
            log.exception("nightly worker: run %s failed", run_id)
            self._finish(run_id, "failed", None, f"{type(error).__name__}: {error}"[:2000])
        else:
            self._finish(run_id, "done", report, None)
            log.info("nightly worker: run %s done", run_id)
        return True

    def _run(self, options: dict[str, Any]) -> dict[str, Any]:
        from models.priors import Objective
        from service.recommendations import nightly

        objectives = [Objective(o) for o in options.get("objectives") or []] or list(Objective)
        mix = options.get("mix")
        with Session(self.database.engine) as session, session.begin():
            report = nightly.run(
                session,
                objectives=objectives,
                ray_address=os.environ.get("RAY_ADDRESS"),
                window=timedelta(hours=float(options.get("window_hours", 24.0))),
                max_canaries=int(options.get("max_canaries", 10)),
                mix={Objective(k): float(v) for k, v in mix.items()} if mix else None,
                local=bool(options.get("local", False)),
            )
        found: dict[str, Any] = json.loads(json.dumps(asdict(report), default=str))
        return found

    def _finish(
        self, run_id: Any, status: str, report: dict[str, Any] | None, error: str | None
    ) -> None:
        with Session(self.database.engine) as session, session.begin():
            run = repository.nightly_run(session, run_id)
            if run is None:
                return
            run.status, run.report, run.error = status, report, error
            run.finished_at = datetime.now(UTC)
