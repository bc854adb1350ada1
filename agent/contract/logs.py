"""Logs both sides write alike: one JSON object per line, with the request id that ties an
agent's call to the service's handling of it.

The agent sends `X-Request-ID` with every call and names it when a call fails; the service
takes a well-formed id from the request (or makes one), returns it in the response, and every
line it logs while handling the request carries it. So an operator holding an agent's error can
find the service's side with one grep, and a log shipper reads fields, not prose.
"""

from __future__ import annotations

import logging
import re
import sys
import uuid
from contextvars import ContextVar
from typing import IO, Literal

REQUEST_ID_HEADER = "X-Request-ID"
_WELL_FORMED = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

# the request being handled (service) or made (agent), for every log line written meanwhile
request_id: ContextVar[str | None] = ContextVar("blkpilot_request_id", default=None)

LogFormat = Literal["json", "text"]


def new_request_id() -> str:
    return uuid.uuid4().hex


def accepted_request_id(value: str | None) -> str | None:
    """A caller's id, if it is one we can log safely (bounded, no spaces or control bytes)."""
    return value if value is not None and _WELL_FORMED.match(value) else None


class _WithRequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


def formatter(log_format: LogFormat) -> logging.Formatter:
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            "{asctime}{levelname}{name}{message}{request_id}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def dressed(handler: logging.Handler, log_format: LogFormat = "json") -> logging.Handler:
    """The handler with the process's format: time, level, logger, message, the request id,
    and a record's extra fields (JSON)."""
    handler.addFilter(_WithRequestId())
    handler.setFormatter(formatter(log_format))
    return handler


def configure(
    log_format: LogFormat = "json", *, level: int = logging.INFO, stream: IO[str] | None = None
) -> logging.Handler:
    """The process's logging: one handler on the root logger, replacing any other."""
    handler = dressed(logging.StreamHandler(stream or sys.stderr), log_format)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return handler
