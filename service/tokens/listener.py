"""`blkpilot serve`'s thread that hears every token change committed through any replica or
the CLI (PostgreSQL LISTEN/NOTIFY on its own connection) and drops what this process kept:
a node's tokens (service.nodes.cache: kept `HEARD_TTL_S` while this hears, `TTL_S` while it
does not) and operators' API tokens (service.tokens.cache: kept only while this hears).

It claims to hear only what it has shown it hears: a probe notice sent on its own connection
must come back, at the start and every `ping_s` after (within `probe_wait_s`), or the
connection is dropped — so a connection broken without a word (a network partition), or one
behind a pooler in transaction mode (where LISTEN registers on a server connection the
notices never reach), falls back to the short TTL instead of keeping revoked tokens.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid

import psycopg
from sqlalchemy import Engine

from service.nodes import repository as node_repository
from service.nodes.cache import NODES, NodeCache
from service.tokens import repository as token_repository
from service.tokens.cache import API_TOKENS, ApiTokenCache

log = logging.getLogger(__name__)
# the listening connection, as pg_stat_activity names it
APPLICATION_NAME = "blkpilot-token-changes"


class Deaf(Exception):
    """The listening connection does not hear what is sent on its channel."""


class TokenChangeListener:
    def __init__(
        self,
        engine: Engine,
        cache: NodeCache = NODES,
        api_tokens: ApiTokenCache = API_TOKENS,
        *,
        retry_s: float = 5.0,
        ping_s: float = 30.0,
        probe_wait_s: float = 5.0,
    ) -> None:
        # the engine's database, on a connection of its own outside the pool (it is held)
        self.conninfo = engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        self.cache, self.api_tokens = cache, api_tokens
        self.retry_s, self.ping_s = retry_s, ping_s
        self.probe_wait_s = probe_wait_s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="token-changes", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                with psycopg.connect(
                    self.conninfo, autocommit=True, application_name=APPLICATION_NAME
                ) as connection:
                    node_repository.listen_for_token_changes(connection)
                    token_repository.listen_for_api_token_changes(connection)
                    self._hear(connection)
            except Exception as error:  # psycopg's OperationalError, Deaf, whatever closed it
                if not self.stopping.is_set():
                    log.warning(
                        "not hearing token changes (%s); a change through another replica"
                        " is refused here within %.0f s; listening again in %.0f s",
                        error,
                        self.cache.ttl_s,
                        self.retry_s,
                    )
            finally:
                self._hear_all(False)
            self.stopping.wait(self.retry_s)

    def _hear(self, connection: psycopg.Connection[object]) -> None:
        """Forgets each node announced. Hearing is claimed only once a probe sent on the
        connection has come back, and one goes every `ping_s`: one not back within
        `probe_wait_s` ends the connection (Deaf)."""
        probe: str | None = self._probe(connection)
        sent = time.monotonic()
        while not self.stopping.is_set():
            for notice in connection.notifies(timeout=1.0):  # a second: stop() is heard
                if notice.payload == probe:
                    if not self.cache.hearing:
                        self._hear_all(True)
                        log.info("hearing token changes from every replica")
                    probe = None
                elif notice.channel == token_repository.API_TOKEN_CHANNEL:
                    self.api_tokens.clear()
                else:
                    with contextlib.suppress(ValueError):  # not a node: another's probe
                        self.cache.forget_node(uuid.UUID(notice.payload))
            waited = time.monotonic() - sent
            if probe is not None and waited > self.probe_wait_s:
                raise Deaf(
                    f"a notice sent on the listening connection was not heard back in"
                    f" {self.probe_wait_s:.0f} s (a pooler in transaction mode?)"
                )
            if probe is None and waited >= self.ping_s:
                probe, sent = self._probe(connection), time.monotonic()

    def _hear_all(self, hearing: bool) -> None:
        self.cache.hear(hearing)
        self.api_tokens.hear(hearing)

    @staticmethod
    def _probe(connection: psycopg.Connection[object]) -> str:
        payload = f"probe:{uuid.uuid4()}"
        node_repository.probe(connection, payload)
        return payload

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)
