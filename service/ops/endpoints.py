"""Liveness, readiness and metrics: outside /api/v1, unauthenticated, for probes and scrapers."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.db import Database, head_revision
from service.deps import AuthFirstRoute
from service.ops import metrics, service

router = APIRouter(tags=["operations"], route_class=AuthFirstRoute)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready; the body says why"}})
def readyz(request: Request) -> JSONResponse:
    """The database answers and its schema is at the migrations' head."""
    database: Database = request.app.state.database
    expected = head_revision()
    try:
        current = service.schema_revision(database)
    except Exception as error:  # any failure to reach the database means "not ready"
        return JSONResponse(
            {"status": "unavailable", "database": "unreachable", "detail": type(error).__name__},
            status_code=503,
        )
    body = {"database": "ok", "schema_revision": current, "head_revision": expected}
    if current != expected:
        return JSONResponse({"status": "unavailable", **body}, status_code=503)
    return JSONResponse({"status": "ok", **body})


@router.get("/metrics", response_class=Response)
def prometheus_metrics() -> Response:
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)
