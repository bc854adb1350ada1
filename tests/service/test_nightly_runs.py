"""The nightly worker of `blkpilot serve` on a database of its own: a run with options the job
cannot take fails with why and does not stop the next one; a run a stopped service left
running is failed when the worker starts again. (The whole path — `blkpilot nightly --url`
against a real service — is tests/test_serve.py's.)"""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from service.db import Database
from service.recommendations.nightly_worker import NightlyWorker
from service.tables import NightlyRun
from tests.conftest import upkeep_database


def test_a_bad_run_fails_with_why_and_the_next_runs(server_url: str) -> None:
    name = f"blkpilot_nightly_{uuid.uuid4().hex[:8]}"
    with upkeep_database(server_url, name) as engine:
        worker = NightlyWorker(Database(engine))
        with Session(engine) as session, session.begin():
            stale = NightlyRun(status="running", options={}, requested_by="gone")
            bad = NightlyRun(
                status="queued", options={"objectives": ["no-such"]}, requested_by="someone"
            )
            session.add_all([stale, bad])
            session.flush()
            stale_id, bad_id = stale.id, bad.id
        assert worker.recover() == 1
        assert worker.run_one()
        with Session(engine) as session, session.begin():  # one at a time, as the API queues
            good = NightlyRun(status="queued", options={"local": True}, requested_by="someone")
            session.add(good)
            session.flush()
            good_id = good.id
        assert worker.run_one()
        assert not worker.run_one()  # nothing left
        with Session(engine) as session:
            found = {row.id: row for row in session.query(NightlyRun)}
        assert found[stale_id].status == "failed"
        assert "stopped while it ran" in (found[stale_id].error or "")
        assert found[bad_id].status == "failed"
        assert "no-such" in (found[bad_id].error or "")
        assert found[good_id].status == "done", found[good_id].error
        report = found[good_id].report or {}
        assert report["where"].startswith("nowhere"), report  # an empty database: said so
        assert found[good_id].finished_at is not None
