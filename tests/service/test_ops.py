from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service import db
from service.app import create_app
from service.settings import Settings
from tests.conftest import create_database, drop_database
from tests.factories import bearer


class TestHealthz:
    def test_ok(self, client: TestClient) -> None:
        assert client.get("/healthz").json() == {"status": "ok"}


class TestReadyz:
    def test_ready_at_head(self, client: TestClient) -> None:
        response = client.get("/readyz")
        assert response.status_code == 200
        body = response.json()
        assert body["schema_revision"] == body["head_revision"] == db.head_revision()
        assert body["head_revision"] is not None

    def test_not_ready_when_schema_is_behind(self, server_url: str, tmp_path: Path) -> None:
        url = create_database(server_url, "blkpilot_test_not_migrated")
        database = db.Database(db.create_db_engine(url, pool_size=1))
        try:
            app = create_app(Settings(database_url=url, data_dir=tmp_path), database)
            with TestClient(app) as client:
                response = client.get("/readyz")
            assert response.status_code == 503
            assert response.json()["schema_revision"] is None
        finally:
            database.dispose()
            drop_database(server_url, "blkpilot_test_not_migrated")

    def test_not_ready_when_database_unreachable(self, tmp_path: Path) -> None:
        url = f"postgresql://postgres@/postgres?host={tmp_path}&connect_timeout=2"
        database = db.Database(db.create_db_engine(url, pool_size=1))
        app = create_app(Settings(database_url=url, data_dir=tmp_path), database)
        with TestClient(app) as client:
            response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["database"] == "unreachable"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


class TestMetrics:
    def test_exposes_requests_ingest_and_pool(self, client: TestClient) -> None:
        client.get("/api/v1/nodes")  # a 401, counted under its route template
        client.get("/api/v1/nodes/00000000-0000-0000-0000-000000000000", headers=bearer("x"))
        text = client.get("/metrics").text
        samples = _samples(text)
        assert (
            samples[
                (
                    "blkpilot_http_requests_total",
                    (("method", "GET"), ("route", "/api/v1/nodes"), ("status", "401")),
                )
            ]
            >= 1
        )
        assert (
            "blkpilot_http_requests_total",
            (("method", "GET"), ("route", "/api/v1/nodes/{node_id}"), ("status", "401")),
        ) in samples
        names = {name for name, _ in samples}
        for expected in (
            "blkpilot_http_request_duration_seconds_bucket",
            "blkpilot_telemetry_windows_ingested_total",
            "blkpilot_db_pool_size",
            "blkpilot_db_pool_checked_out",
        ):
            assert expected in names, expected

    def test_unmatched_paths_share_one_label(self, client: TestClient) -> None:
        client.get("/no/such/path/12345")
        text = client.get("/metrics").text
        assert "/no/such/path/12345" not in text
        assert 'route="unmatched"' in text


class TestErrorShape:
    def test_unknown_route_is_404_in_the_one_shape(self, client: TestClient) -> None:
        response = client.get("/api/v1/nothing-here")
        assert response.status_code == 404
        assert response.json() == {"error": "not_found", "detail": "Not Found", "fields": []}

    def test_wrong_method_is_405_in_the_one_shape(self, client: TestClient) -> None:
        response = client.delete("/api/v1/api-tokens")
        assert response.status_code == 405
        assert response.json()["error"] == "method_not_allowed"
        # every method the path serves, not only the first route's
        assert response.headers["Allow"] == "GET, POST"

    def test_malformed_json_is_422(self, client: TestClient) -> None:
        response = client.post(
            "/api/v1/nodes",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 422
        assert response.json()["error"] == "validation_error"


@pytest.fixture
def openapi(client: TestClient) -> dict[str, Any]:
    spec: dict[str, Any] = client.get("/openapi.json").json()
    return spec


class TestOpenAPI:
    def test_every_api_operation_lists_its_errors(self, openapi: dict[str, Any]) -> None:
        paths = openapi["paths"]
        api_paths = [path for path in paths if path.startswith("/api/v1/")]
        assert len(api_paths) >= 12
        for path in api_paths:
            for method, operation in paths[path].items():
                codes = set(operation["responses"])
                if (method, path) != ("post", "/api/v1/nodes"):  # enrollment: token in body
                    assert "401" in codes, (method, path)
                assert "422" in codes or method == "get" or method == "delete", (method, path)

    def test_validation_errors_are_documented_in_the_one_shape(
        self, openapi: dict[str, Any]
    ) -> None:
        assert "HTTPValidationError" not in openapi["components"]["schemas"]
        for methods in openapi["paths"].values():
            for operation in methods.values():
                if "422" in operation["responses"]:
                    content = operation["responses"]["422"]["content"]["application/json"]
                    assert content["schema"] == {"$ref": "#/components/schemas/ErrorBody"}

    def test_errors_document_the_error_shape(self, openapi: dict[str, Any]) -> None:
        assert set(openapi["components"]["schemas"]["ErrorBody"]["properties"]) >= {
            "error",
            "detail",
        }
