"""The agent's HTTP client for the service. All transport errors become agent errors here."""

from __future__ import annotations

import math
import ssl
import time
import uuid
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
from pydantic import BaseModel

from agent.contract.logs import REQUEST_ID_HEADER, new_request_id, request_id
from agent.contract.wire import (
    AppliedStateReport,
    CanaryDone,
    EnrollRequest,
    EnrollResponse,
    Heartbeat,
    InventoryReport,
    ObservationCreate,
    TelemetryBatch,
    TelemetryBatchReceipt,
    TokenIssued,
)
from agent.errors import RateLimited, ServiceRejected, ServiceUnreachable

API = "/api/v1"
# without a usable Retry-After, a 429 holds the client off this long
DEFAULT_RETRY_AFTER_S = 5.0
MAX_RETRY_AFTER_S = 3600.0


def retry_after_seconds(value: str | None, now: float | None = None) -> float:
    """Retry-After as seconds: a number of seconds or an HTTP date (RFC 9110 10.2.3); a
    missing or unreadable value gives the default, and no wait is longer than an hour."""
    if value is None:
        return DEFAULT_RETRY_AFTER_S
    value = value.strip()
    try:
        seconds = float(value) if value.isdigit() else None
        if seconds is None:
            when = parsedate_to_datetime(value).timestamp()
            seconds = when - (time.time() if now is None else now)
    except (ValueError, TypeError, OverflowError):
        return DEFAULT_RETRY_AFTER_S
    if math.isnan(seconds):
        return DEFAULT_RETRY_AFTER_S
    return min(MAX_RETRY_AFTER_S, max(0.0, seconds))


class ServiceClient:
    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        ca_bundle: Path | None = None,
        max_wait_s: float = 60.0,
    ) -> None:
        """`ca_bundle`: the CAs an https service's certificate must chain to (PEM); default,
        the system's. Certificates are always verified: name, dates and chain.
        `max_wait_s`: how long one call may wait out the service's Retry-After (a command, a
        bulk report); the agent's loop passes 0 — it never blocks, its spool holds the
        telemetry."""
        self._max_wait_s = max_wait_s
        # this node's clock less the service's, from the Date of its last answer (whole
        # seconds; positive: the node is ahead); None before an answer with a Date
        self.clock_offset_s: float | None = None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        verify: ssl.SSLContext | bool = True
        if ca_bundle is not None:
            try:
                verify = ssl.create_default_context(cafile=str(ca_bundle))
            except (OSError, ssl.SSLError) as error:
                raise ServiceUnreachable(f"CA bundle {ca_bundle} unusable: {error}") from error
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=verify,
        )
        self._not_before = 0.0  # monotonic: the service asked for no calls until then (429, 503)
        self._held_by = (429, "rate_limited")  # the answer that asked it

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def held_for(self) -> float:
        """Seconds left of the hold-off the service last asked for (0: none)."""
        return max(0.0, self._not_before - time.monotonic())

    def _request(self, method: str, path: str, body: BaseModel | None = None) -> Any:
        """One call. Over the rate limit (429) or while the service's database is away (503),
        the client waits out Retry-After and tries again
        while the waits fit in `max_wait_s`; past that it raises RateLimited, and until the
        time the service named its calls fail at once, without reaching the service."""
        waited = 0.0
        while True:
            wait = self._not_before - time.monotonic()
            if wait > 0:
                if waited + wait > self._max_wait_s:
                    status, error = self._held_by
                    raise RateLimited(
                        wait,
                        f"holding off {wait:.1f} s more, as the service asked ({status})",
                        status=status,
                        error=error,
                    )
                time.sleep(wait)
                waited += wait
            try:
                return self._send(method, path, body)
            except RateLimited:
                if waited + self._not_before - time.monotonic() > self._max_wait_s:
                    raise

    def _read_clock(self, response: httpx.Response) -> None:
        date = response.headers.get("date")
        if date is None:
            return
        try:
            served = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return
        # against the middle of the call, to the Date's whole second
        elapsed = response.elapsed.total_seconds() if response.is_closed else 0.0
        self.clock_offset_s = round(time.time() - elapsed / 2 - served, 1)

    def _send(self, method: str, path: str, body: BaseModel | None) -> Any:
        """One request, with its own request id: logged here while it runs, sent to the service
        (whose log lines for it carry the same id), and named in any error."""
        rid = new_request_id()
        headers = {REQUEST_ID_HEADER: rid}
        if body is not None:
            headers["Content-Type"] = "application/json"
        token = request_id.set(rid)
        try:
            response = self._http.request(
                method,
                API + path,
                content=body.model_dump_json() if body is not None else None,
                headers=headers,
            )
        except httpx.TransportError as error:
            raise ServiceUnreachable(f"{self._http.base_url}: {error} (request {rid})") from error
        finally:
            request_id.reset(token)
        self._read_clock(response)
        if response.is_error:
            try:
                payload = response.json()
                name, detail = str(payload["error"]), str(payload["detail"])
            except (ValueError, KeyError, TypeError):
                name, detail = "http_error", response.text[:500]
            rid = response.headers.get(REQUEST_ID_HEADER, rid)
            # 429: over the rate limit; 503 with Retry-After: the service's database is away
            held_off = response.status_code == 429 or (
                response.status_code == 503 and "Retry-After" in response.headers
            )
            if held_off:
                wait = retry_after_seconds(response.headers.get("Retry-After"))
                self._not_before = time.monotonic() + wait
                self._held_by = (response.status_code, name)
                raise RateLimited(
                    wait, detail, request_id=rid, status=response.status_code, error=name
                )
            raise ServiceRejected(response.status_code, name, detail, request_id=rid)
        return response.json() if response.content else None

    def enroll(self, request: EnrollRequest) -> EnrollResponse:
        data = self._request("POST", "/nodes", request)
        return EnrollResponse(
            node_id=data["node"]["id"],
            node_token=data["node_token"],
            expires_at=data.get("expires_at"),
            renew_after=data.get("renew_after"),
        )

    def renew_token(self, node_id: uuid.UUID) -> TokenIssued:
        """A new node token; the one this client holds stays good for the service's grace
        period. The client goes on with the one it holds until told (use_token)."""
        return TokenIssued.model_validate(self._request("POST", f"/nodes/{node_id}/token"))

    def use_token(self, token: str) -> None:
        self._http.headers["Authorization"] = f"Bearer {token}"

    def heartbeat(self, node_id: uuid.UUID, beat: Heartbeat) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", f"/nodes/{node_id}/heartbeat", beat)
        return result

    def put_inventory(self, node_id: uuid.UUID, report: InventoryReport) -> dict[str, Any]:
        result: dict[str, Any] = self._request("PUT", f"/nodes/{node_id}/inventory", report)
        return result

    def send_telemetry(self, batch: TelemetryBatch) -> TelemetryBatchReceipt:
        return TelemetryBatchReceipt.model_validate(
            self._request("POST", "/telemetry/batches", batch)
        )

    def devices(self, node_id: uuid.UUID) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", f"/nodes/{node_id}/devices")
        return result

    def record_observation(self, observation: ObservationCreate) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", "/observations", observation)
        return result

    def scheduled_canaries(self, node_id: uuid.UUID) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", f"/nodes/{node_id}/canaries")
        return result

    def canary_done(self, canary_id: uuid.UUID, observation_id: uuid.UUID) -> dict[str, Any]:
        result: dict[str, Any] = self._request(
            "POST", f"/canaries/{canary_id}/done", CanaryDone(observation_id=observation_id)
        )
        return result

    def policies(self, node_id: uuid.UUID) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", f"/nodes/{node_id}/policies")
        return result

    def report_applied(self, device_id: uuid.UUID, report: AppliedStateReport) -> dict[str, Any]:
        result: dict[str, Any] = self._request(
            "POST", f"/devices/{device_id}/applied-state", report
        )
        return result
