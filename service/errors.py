"""The service's error tree. Every error leaves the API as {"error": ..., "detail": ...}.

BlkpilotError (500)
├── Unauthorized (401)   no token, or a token nobody issued
├── Forbidden (403)      a real token without the right to do this
├── NotFound (404)
├── Conflict (409)
├── PayloadTooLarge (413)
├── UnsupportedMediaType (415)  a JSON endpoint sent another Content-Type
├── Unprocessable (422)  well-formed but not acceptable (unknown device, bad policy)
│   └── ClockAhead (422)   telemetry that ends in the future: the node's clock is ahead
└── ServiceUnavailable (503)  the database is away: retry after Retry-After
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agent.contract.base import CLOCK_AHEAD


class ErrorBody(BaseModel):
    """Every error's one shape; `fields` names what was wrong in the request, empty when the
    error is not about a field (a missing token, an unknown id, a body too large)."""

    error: str
    detail: str
    fields: list[dict[str, Any]] = Field(default_factory=list)


class BlkpilotError(Exception):
    status_code = 500
    error = "internal_error"

    def __init__(self, detail: str, *, fields: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fields = fields

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.error, detail=self.detail, fields=self.fields or [])


class Unauthorized(BlkpilotError):
    """Missing or unknown token."""

    status_code = 401
    error = "unauthorized"


class Forbidden(BlkpilotError):
    """The token lacks the right for this action."""

    status_code = 403
    error = "forbidden"


class NotFound(BlkpilotError):
    """No such resource."""

    status_code = 404
    error = "not_found"


class Conflict(BlkpilotError):
    """Conflicts with the current state."""

    status_code = 409
    error = "conflict"


class PayloadTooLarge(BlkpilotError):
    """The request body is too large."""

    status_code = 413
    error = "payload_too_large"


class UnsupportedMediaType(BlkpilotError):
    """The body is not JSON (Content-Type: application/json)."""

    status_code = 415
    error = "unsupported_media_type"


class TooManyRequests(BlkpilotError):
    """Over the caller's rate limit: retry after the seconds in Retry-After."""

    status_code = 429
    error = "rate_limited"


class Unprocessable(BlkpilotError):
    """The request is well-formed but cannot be accepted."""

    status_code = 422
    error = "unprocessable"


class ClockAhead(Unprocessable):
    """Telemetry windows end further in the future than clocks may be off: the node's clock
    is ahead. Its own error name, so that an agent holds the batch until real time catches
    up rather than setting it aside for good (agents before 2026-12 see a 422 as before)."""

    error = CLOCK_AHEAD


class ServiceUnavailable(BlkpilotError):
    """The database cannot be reached just now: retry after the seconds in Retry-After."""

    status_code = 503
    error = "service_unavailable"


def responses(*errors: type[BlkpilotError]) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of an endpoint: each error it may return, in the one shape."""
    return {
        error.status_code: {"model": ErrorBody, "description": error.__doc__ or error.error}
        for error in errors
    }
