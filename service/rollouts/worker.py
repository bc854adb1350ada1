"""The rollout worker thread that `blkpilot serve` runs beside the API."""

from __future__ import annotations

import logging
import threading

from service.db import Database
from service.rollouts.ansible import PlaybookRunner, default_playbooks_dir, load_host_vars
from service.rollouts.engine import Engine
from service.settings import Settings

log = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(self, settings: Settings, database: Database) -> None:
        runner = PlaybookRunner(
            settings.playbooks_dir or default_playbooks_dir(),
            settings.data_dir / "rollouts",
            load_host_vars(settings.rollout_host_vars),
        )
        self.poll = settings.rollout_poll_seconds
        self.stopping = threading.Event()
        self.engine = Engine(
            database, runner, lease_seconds=settings.rollout_lease_seconds, stop=self.stopping
        )
        self.thread = threading.Thread(target=self._loop, name="rollout-worker", daemon=True)

    def start(self) -> None:
        log.info("rollout worker %s started", self.engine.owner)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                rollout_id = self.engine.claim()
                if rollout_id is None:
                    self.stopping.wait(self.poll)
                    continue
                self.engine.step(rollout_id)
                self.stopping.wait(min(self.poll, 0.5))
            except Exception:
                log.exception("rollout worker step failed; retrying")
                self.stopping.wait(max(self.poll, 5.0))

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel the playbook under way (its devices are recovered by the next worker) and
        give the leases back so a restarted service goes on at once."""
        self.stopping.set()
        self.thread.join(timeout)
        try:
            self.engine.release()
        except Exception:
            log.exception("rollout leases not released; they expire by themselves")
        log.info("rollout worker %s stopped", self.engine.owner)
