"""`blkpilot serve`'s thread that hears every node-token change committed through any replica
(PostgreSQL LISTEN/NOTIFY on its own connection) and drops what this process kept of that node
(service.nodes.cache). While it hears, the cache keeps a principal `HEARD_TTL_S`; when its
connection is lost the cache is emptied and falls back to `TTL_S` until it listens again.

A connection that breaks without a word (a network partition) is found by a ping every
`ping_s`; until then changes may go unheard, as they would be without the listener.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import psycopg
from sqlalchemy import Engine

from service.nodes import repository
from service.nodes.cache import NODES, NodeCache

log = logging.getLogger(__name__)


class TokenChangeListener:
    def __init__(
        self,
        engine: Engine,
        cache: NodeCache = NODES,
        *,
        retry_s: float = 5.0,
        ping_s: float = 30.0,
    ) -> None:
        # the engine's database, on a connection of its own outside the pool (it is held)
        self.conninfo = engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        self.cache, self.retry_s, self.ping_s = cache, retry_s, ping_s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="token-changes", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as connection:
                    repository.listen_for_token_changes(connection)
                    self.cache.hear(True)
                    log.info("hearing node-token changes from every replica")
                    self._hear(connection)
            except Exception as error:  # psycopg's OperationalError, whatever closed it
                if not self.stopping.is_set():
                    log.warning(
                        "not hearing node-token changes (%s); a change through another replica"
                        " is refused here within %.0f s; listening again in %.0f s",
                        error,
                        self.cache.ttl_s,
                        self.retry_s,
                    )
            finally:
                self.cache.hear(False)
            self.stopping.wait(self.retry_s)

    def _hear(self, connection: psycopg.Connection[object]) -> None:
        pinged = time.monotonic()
        while not self.stopping.is_set():
            for notice in connection.notifies(timeout=1.0):  # a second: stop() is heard
                try:
                    self.cache.forget_node(uuid.UUID(notice.payload))
                except ValueError:
                    log.warning("a node-token change naming no node: %r", notice.payload)
            if time.monotonic() - pinged >= self.ping_s:
                repository.ping(connection)
                pinged = time.monotonic()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)
