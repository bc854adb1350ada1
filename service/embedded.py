"""The embedded PostgreSQL (pgserver) used when no BLKPILOT_DATABASE_URL is given.

It listens only on a Unix socket inside the data directory and is stopped when the last
process that opened it lets go (pgserver counts handles across processes).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir / "postgres"
        self._server: Any = None

    def start(self) -> str:
        """Start (or attach to) the server; return its SQLAlchemy URL."""
        from pgserver import postgres_server

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting embedded PostgreSQL in %s", self.pgdata)
        self._server = postgres_server.get_server(self.pgdata, cleanup_mode="stop")
        uri: str = self._server.get_uri()
        return uri

    def stop(self) -> None:
        if self._server is not None:
            log.info("stopping embedded PostgreSQL in %s", self.pgdata)
            self._server.cleanup()
            self._server = None

    @property
    def running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
