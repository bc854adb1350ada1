"""What a hostile client or a failing database found (issue 31): authentication before any
body is read, text PostgreSQL cannot store refused with 422, a JSON endpoint sent other media
refused with 415, and the database away answered 503 with Retry-After — which the agent's
client waits out as it does a 429, its spool keeping every window."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from agent.client import ServiceClient
from agent.contract.wire import TelemetryBatch
from agent.errors import RateLimited
from agent.spool import Spool
from service import db
from service.app import DATABASE_RETRY_AFTER_S, create_app
from service.db import Database
from service.security import Role
from service.settings import Settings
from tests.factories import (
    bearer,
    create_api_token,
    create_enrollment_token,
    create_node,
    device_inventory,
    report_inventory,
    telemetry_window,
)

BATCHES = "/api/v1/telemetry/batches"


def _post_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """An ASGI scope of a POST to the app itself, from loopback."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
        "state": {},
    }


def _asgi_post(app: FastAPI, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bool]:
    """POST through the ASGI app itself; returns the status and whether the app ever asked
    for the body."""
    read = False
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal read, sent
        if sent:
            await asyncio.sleep(3600)  # the client stays connected
        read, sent = True, True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = _post_scope(
        path,
        [
            (b"content-length", str(len(body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ],
    )
    asyncio.run(app(scope, receive, send))
    return status, read


class TestAuthenticationBeforeTheBody:
    def test_a_batch_without_a_token_is_refused_unread(self, app: FastAPI) -> None:
        body = b'{"batch_id": "' + b"x" * 1_000_000 + b'"}'
        status, read = _asgi_post(app, BATCHES, {"content-type": "application/json"}, body)
        assert (status, read) == (401, False)

    def test_a_batch_with_an_unknown_token_is_refused_unread(self, app: FastAPI) -> None:
        headers = {"content-type": "application/json", **bearer("bpn_" + "0" * 40)}
        status, read = _asgi_post(app, BATCHES, headers, b"{not json")
        assert (status, read) == (401, False)

    def test_a_known_token_gets_its_body_read(self, app: FastAPI, session: Session) -> None:
        _, token = create_node(session)
        headers = {"content-type": "application/json", **bearer(token)}
        status, read = _asgi_post(app, BATCHES, headers, b"{not json")
        assert (status, read) == (422, True)

    @pytest.mark.parametrize(
        "path",
        ["/api/v1/rollouts", "/api/v1/observations", "/api/v1/enrollment-tokens"],
    )
    def test_invalid_json_without_a_token_is_401_everywhere(
        self, client: TestClient, path: str
    ) -> None:
        response = client.post(
            path, content=b"{not json", headers={"content-type": "application/json"}
        )
        assert response.status_code == 401, response.text
        assert response.json()["error"] == "unauthorized"

    def test_a_viewer_is_refused_before_its_body_is_parsed(
        self, client: TestClient, session: Session
    ) -> None:
        viewer = create_api_token(session, role=Role.VIEWER)
        response = client.post(
            "/api/v1/rollouts",
            content=b"{not json",
            headers={"content-type": "application/json", **bearer(viewer)},
        )
        assert response.status_code == 403, response.text


class TestUnstorableText:
    SURROGATE = '{"labels": {"rack": "a\\ud800"}}'

    def test_enrollment_token_labels(self, client: TestClient, session: Session) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.post(
            "/api/v1/enrollment-tokens",
            content=self.SURROGATE.encode(),
            headers={"content-type": "application/json", **bearer(admin)},
        )
        assert response.status_code == 422, response.text
        assert "surrogate" in response.json()["fields"][0]["msg"]

    def test_enrollment_labels(self, client: TestClient, session: Session) -> None:
        body = {
            "enrollment_token": create_enrollment_token(session),
            "hostname": "node-x",
            "labels": {"rack": "a\ud800"},
        }
        response = client.post(
            "/api/v1/nodes",
            content=json.dumps(body).encode(),  # ensure_ascii: "\ud800" as an escape
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 422, response.text
        assert response.json()["fields"]

    def test_rollout_selector(self, client: TestClient, session: Session) -> None:
        operator = create_api_token(session, role=Role.OPERATOR)
        body = {
            "name": "r",
            "config": {"scheduler": "none"},
            "target": {"node_labels": {"rack\udfff": "a"}},
            "reason": "a hostile label",
        }
        response = client.post(
            "/api/v1/rollouts",
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json", **bearer(operator)},
        )
        assert response.status_code == 422, response.text
        # and the connection is still good: the next call is answered
        assert client.get("/api/v1/rollouts", headers=bearer(operator)).status_code == 200

    def test_a_surrogate_in_a_telemetry_batch(self, client: TestClient, session: Session) -> None:
        node, token = create_node(session)
        report_inventory(session, node, device_inventory("loop0"))
        window = telemetry_window("loop0", latency_note="x\ud83d")
        body = {"batch_id": str(uuid.uuid4()), "windows": [window]}
        response = client.post(
            BATCHES,
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json", **bearer(token)},
        )
        assert response.status_code == 422, response.text


class TestMediaType:
    @pytest.mark.parametrize("media", ["text/plain", "application/x-www-form-urlencoded", ""])
    def test_a_json_endpoint_sent_other_media_is_415(
        self, client: TestClient, session: Session, media: str
    ) -> None:
        _, token = create_node(session)
        headers = {**bearer(token), "content-type": media}
        batch = {"batch_id": str(uuid.uuid4()), "windows": [telemetry_window("loop0")]}
        response = client.post(BATCHES, content=json.dumps(batch).encode(), headers=headers)
        assert response.status_code == 415, response.text
        assert response.json()["error"] == "unsupported_media_type"

    def test_json_with_a_charset_is_json(self, client: TestClient, session: Session) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.post(
            "/api/v1/enrollment-tokens",
            content=b"{}",
            headers={"content-type": "application/json; charset=utf-8", **bearer(admin)},
        )
        assert response.status_code == 201, response.text

    @pytest.mark.parametrize("charset", ["latin-1", "utf-16", "iso-8859-1"])
    def test_json_declared_in_another_charset_is_415(
        self, client: TestClient, session: Session, charset: str
    ) -> None:
        """JSON has one encoding (RFC 8259): `application/json; charset=latin-1` was taken
        and read as UTF-8."""
        admin = create_api_token(session, role=Role.ADMIN)
        response = client.post(
            "/api/v1/enrollment-tokens",
            content=b"{}",
            headers={"content-type": f"application/json; charset={charset}", **bearer(admin)},
        )
        assert response.status_code == 415, response.text
        assert "UTF-8" in response.json()["detail"]


def test_a_client_that_hangs_up_mid_body_is_not_a_server_error(
    app: FastAPI, client: TestClient
) -> None:
    """Issue 64: a client that hung up while `POST /nodes` read its body was logged as an
    unhandled error and counted as a 500 (which feeds the server-errors alert)."""
    from service.ops.metrics import REGISTRY

    def count(status: str) -> float:
        labels = {"method": "POST", "route": "/api/v1/nodes", "status": status}
        return REGISTRY.get_sample_value("blkpilot_http_requests_total", labels) or 0.0

    before = count("500"), count("499")
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = _post_scope(
        "/api/v1/nodes", [(b"content-type", b"application/json"), (b"content-length", b"400")]
    )
    asyncio.run(app(scope, receive, send))
    assert status == 499
    assert (count("500"), count("499")) == (before[0], before[1] + 1)


@pytest.fixture
def away(tmp_path: Path) -> TestClient:
    """A service whose database is not there (nothing listens on its port)."""
    url = "postgresql+psycopg://blkpilot@127.0.0.1:9/blkpilot"
    settings = Settings(database_url=url, data_dir=tmp_path)
    engine = db.create_db_engine(url, pool_size=1)
    return TestClient(create_app(settings, Database(engine)), raise_server_exceptions=False)


class TestDatabaseAway:
    def test_503_with_retry_after(self, away: TestClient) -> None:
        response = away.get("/api/v1/nodes", headers=bearer("bpo_" + "0" * 40))
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
        assert response.json()["error"] == "service_unavailable"
        assert away.get("/readyz").status_code == 503

    def test_the_agent_holds_off_and_its_spool_keeps_the_batch(
        self, away: TestClient, tmp_path: Path
    ) -> None:
        agent = ServiceClient(
            str(away.base_url), "bpn_" + "0" * 40, transport=away._transport, max_wait_s=0
        )
        spool = Spool(tmp_path / "spool", max_batches=10, max_bytes=1 << 20)
        batch = TelemetryBatch.model_validate(
            {"batch_id": str(uuid.uuid4()), "windows": [telemetry_window("loop0")]}
        )
        spool.put(batch)
        result = spool.drain(agent.send_telemetry)
        assert (result.sent, result.rejected) == (0, 0)
        assert "503" in (result.stopped or "")
        assert spool.pending()  # kept for later
        with pytest.raises(RateLimited) as held:  # held off: not sent at all
            agent.send_telemetry(batch)
        assert held.value.status == 503
        assert 0 < held.value.retry_after <= DATABASE_RETRY_AFTER_S


class TestTheSchemaSaysWhatTheServiceRefuses:
    """Issue 64: requests valid by the OpenAPI document got 422 (a label key off its pattern,
    NUL or a lone surrogate in free text, a configuration that asks for nothing). The document
    now states each rule: what the service refuses, the schema refuses too — and what it
    takes, the schema takes."""

    @staticmethod
    def _valid(client: TestClient, component: str, body: Any) -> bool:
        import jsonschema  # type: ignore[import-untyped]  # (schemathesis's own)

        spec = client.get("/openapi.json").json()
        schema = {"$ref": f"#/components/schemas/{component}", "components": spec["components"]}
        return bool(jsonschema.Draft202012Validator(schema).is_valid(body))

    @pytest.mark.parametrize(
        ("body", "accepted"),
        [
            ({"labels": {"rack": "r12"}}, True),
            ({"labels": {"Rack Key": "r12"}}, False),
            ({"labels": {"rack": "r\u000012"}}, False),
        ],
    )
    def test_enrollment_token_labels(
        self, client: TestClient, session: Session, body: Any, accepted: bool
    ) -> None:
        admin = create_api_token(session, role=Role.ADMIN)
        assert self._valid(client, "EnrollmentTokenCreate", body) is accepted
        response = client.post("/api/v1/enrollment-tokens", json=body, headers=bearer(admin))
        assert (response.status_code == 201) is accepted, response.text

    @pytest.mark.parametrize(
        ("config", "reason", "accepted"),
        [
            ({"scheduler": "none"}, "for the schema", True),
            ({}, "for the schema", False),
            ({"scheduler": None}, "for the schema", False),
            ({"scheduler": "none"}, "nul\u0000here", False),
            ({"scheduler": "none"}, "lone \ud800 surrogate", False),
        ],
    )
    def test_policy_configs_and_free_text(
        self, client: TestClient, session: Session, config: Any, reason: str, accepted: bool
    ) -> None:
        node, _ = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        operator = create_api_token(session, role=Role.OPERATOR)
        body = {"config": config, "reason": reason}
        assert self._valid(client, "PolicySet", body) is accepted
        response = client.put(
            f"/api/v1/devices/{device.id}/policy",
            content=json.dumps(body).encode(),
            headers={**bearer(operator), "content-type": "application/json"},
        )
        assert (response.status_code == 200) is accepted, response.text
