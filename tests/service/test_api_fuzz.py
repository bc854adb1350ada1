"""Property-based fuzzing of every API operation from its own OpenAPI spec (schemathesis).

Whatever the input — valid, malformed, huge, negative, non-finite — the service answers without
a server error, and its responses match what the spec documents (status codes and body shapes).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import APIOperation, Case, checks
from schemathesis.core.result import Err
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from service.app import create_app
from service.db import Database, create_db_engine
from service.security import Role
from service.settings import Settings
from tests.factories import (
    bearer,
    create_api_token,
    create_node,
    device_inventory,
    report_inventory,
)

# The spec needs no database: the engine here never connects. Each test binds the app to its
# own transaction through the session dependency (see `bound_app`).
APP = create_app(
    Settings(
        database_url="postgresql://fuzz@/unused",
        data_dir=Path(tempfile.gettempdir()),
        rate_limit="1000000/second",  # fuzzing, not load: every case reaches the endpoint
    ),
    Database(create_db_engine("postgresql://fuzz@/unused")),
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

# Operations only a node's agent may call: fuzz them with a node token, so that validation
# and the service code run rather than stopping at 403.
NODE_OPERATIONS = {
    ("POST", "/api/v1/nodes/{node_id}/heartbeat"),
    ("PUT", "/api/v1/nodes/{node_id}/inventory"),
    ("POST", "/api/v1/telemetry/batches"),
    ("POST", "/api/v1/devices/{device_id}/applied-state"),
    ("POST", "/api/v1/observations"),
}


# What must hold for any input. Not checked: that every schema-valid request is accepted (the
# spec cannot express cross-field rules such as "a canary has a verdict", or references to
# devices that must exist) and that every schema-violating one is refused.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.allow_header_conformance,
]
EXCLUDED = [
    checks.positive_data_acceptance,
    checks.negative_data_rejection,
    checks.unsupported_method,
    checks.missing_required_header,
    checks.ignored_auth,
]


@pytest.fixture
def bound_app(app: FastAPI, engine: Engine) -> Iterator[FastAPI]:
    """The module's app, on the test's transaction and the real engine (for /readyz)."""
    APP.dependency_overrides = dict(app.dependency_overrides)
    APP.state.database = Database(engine)
    yield APP
    APP.dependency_overrides = {}


@dataclass
class World:
    admin: str
    node_token: str
    node_id: str
    device_ids: list[str]
    device_names: list[str]


@pytest.fixture
def world(session: Session) -> World:
    node, node_token = create_node(session, hostname="fuzzed")
    devices = report_inventory(session, node, device_inventory("loop0"), device_inventory("sda"))
    return World(
        admin=create_api_token(session, role=Role.ADMIN),
        node_token=node_token,
        node_id=str(node.id),
        device_ids=[str(d.id) for d in devices],
        device_names=[d.name for d in devices],
    )


def aim_at_real_things(case: Case[Any], world: World) -> None:
    """Point generated ids and device names at what exists, so requests get past the 404s
    and unknown-device checks into the service and database code."""
    params = case.path_parameters or {}
    if "node_id" in params:
        params["node_id"] = world.node_id
    if "device_id" in params:
        params["device_id"] = world.device_ids[len(str(params["device_id"])) % 2]
    body = case.body
    if isinstance(body, dict):
        if "device_id" in body:
            body["device_id"] = world.device_ids[0]
        windows = body.get("windows")
        if isinstance(windows, list):
            for i, window in enumerate(windows):
                if isinstance(window, dict) and "device" in window:
                    window["device"] = world.device_names[i % 2]


# one test per operation, named by it: schemathesis' own parametrize gives all 44 one node id,
# and pytest-xdist (make test's two workers) keeps one test per id — it ran one operation of 44
def _operations() -> list[APIOperation[Any, Any, Any, Any]]:
    found = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):  # an operation the spec cannot describe: at collection
            raise result.err()
        found.append(result.ok())
    return found


OPERATIONS = _operations()


@pytest.mark.parametrize("operation", OPERATIONS, ids=[o.label for o in OPERATIONS])
def test_no_server_errors_and_responses_match_the_spec(
    operation: APIOperation[Any, Any, Any, Any], world: World, bound_app: FastAPI
) -> None:
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=operation.as_strategy())
    def fuzz(case: Case[Any]) -> None:
        aim_at_real_things(case, world)
        key = (case.method.upper(), case.operation.path)
        token = world.node_token if key in NODE_OPERATIONS else world.admin
        case.call_and_validate(headers=bearer(token), checks=CHECKS, excluded_checks=EXCLUDED)

    fuzz()


def test_every_operation_of_the_spec_is_fuzzed_under_a_name_of_its_own() -> None:
    methods = {"get", "put", "post", "patch", "delete"}
    spec = {
        f"{method.upper()} {path}"
        for path, item in APP.openapi()["paths"].items()
        for method in item
        if method in methods
    }
    labels = [o.label for o in OPERATIONS]
    assert len(labels) == len(set(labels))
    assert set(labels) == spec
