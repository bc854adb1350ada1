"""Request ids and JSON logs: one id ties an agent's call to the service's lines about it."""

from __future__ import annotations

import io
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agent.client import ServiceClient
from agent.contract.logs import REQUEST_ID_HEADER, configure
from agent.errors import ServiceRejected
from tests.proc import ServiceProcess


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The process's logging as `blkpilot serve` sets it, into a buffer; put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buffer = io.StringIO()
    configure("json", stream=buffer)
    yield buffer
    root.handlers[:] = handlers
    root.setLevel(level)


def _lines(buffer: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


def test_the_callers_id_is_returned_and_on_every_line_logged_for_it(
    client: TestClient, json_log: io.StringIO
) -> None:
    response = client.get("/api/v1/nodes", headers={REQUEST_ID_HEADER: "agent-42.call:7"})
    assert response.status_code == 401
    assert response.headers[REQUEST_ID_HEADER] == "agent-42.call:7"
    (access,) = [line for line in _lines(json_log) if line["logger"] == "blkpilot.access"]
    assert access["request_id"] == "agent-42.call:7"
    assert access["level"] == "INFO"
    assert (access["method"], access["route"], access["status"]) == ("GET", "/api/v1/nodes", 401)
    assert isinstance(access["duration_ms"], float)
    assert {"time", "message"} <= set(access)


@pytest.mark.parametrize("given", [None, "", "has spaces", "x" * 65, "new\nline"])
def test_an_id_missing_or_unsafe_to_log_is_replaced(
    client: TestClient, json_log: io.StringIO, given: str | None
) -> None:
    headers = {REQUEST_ID_HEADER: given} if given is not None and "\n" not in given else {}
    response = client.get("/healthz", headers=headers)
    made = response.headers[REQUEST_ID_HEADER]
    assert re.fullmatch(r"[0-9a-f]{32}", made), made
    assert made != given
    assert any(line.get("request_id") == made for line in _lines(json_log))


def test_an_agents_refused_call_names_the_id_the_service_logged(
    service: ServiceProcess, tmp_path: Path
) -> None:
    """The real agent client against the real service: the error the agent logs names the
    request, and the service's log (JSON, one object a line) has that request's line."""
    agent = ServiceClient(service.base_url, "bpn_" + uuid.uuid4().hex)
    with agent, pytest.raises(ServiceRejected) as refused:
        agent.devices(uuid.uuid4())
    rid = refused.value.request_id
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    assert f"(request {rid})" in str(refused.value)

    def lines() -> list[dict[str, Any]]:
        logged = [
            json.loads(line)
            for line in (service.data_dir / "serve.log").read_text().splitlines()
            if line.startswith("{")
        ]
        return [entry for entry in logged if entry.get("request_id") == rid]

    # the access line is written once the response has gone out: on a busy machine, a moment
    # after the client has it
    deadline = time.monotonic() + 10
    while not lines() and time.monotonic() < deadline:
        time.sleep(0.1)
    (line,) = lines()
    assert line["status"] == 401
    assert line["route"] == "/api/v1/nodes/{node_id}/devices"
