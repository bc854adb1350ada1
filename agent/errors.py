"""The agent's exceptions.

AgentError
├── NotEnrolled           no node state on disk yet
├── StateUnreadable       node.json is there but cannot be read (exit status 78, EX_CONFIG)
├── MetricsPortUnavailable  the exporter's address cannot be bound (`agent run` exits 1)
└── ServiceError
    ├── ServiceUnreachable    connection refused, timed out, DNS (retry later; spool)
    └── ServiceRejected       the service answered with an error (4xx/5xx): .status, .error
        └── RateLimited       429, or 503 (its database away): not before .retry_after
                              seconds (the client holds off)
"""

from __future__ import annotations


class AgentError(Exception):
    pass


class NotEnrolled(AgentError):
    pass


# sysexits.h's EX_CONFIG: the agent's units list it in RestartPreventExitStatus, so systemd
# stops restarting an agent that cannot start until someone repairs its state
EXIT_STATE_UNREADABLE = 78


class StateUnreadable(AgentError):
    """The node's state file exists but is not a node's state (truncated, emptied, edited):
    restarting cannot help; re-enrolling or restoring the file does."""

    exit_status = EXIT_STATE_UNREADABLE


class MetricsPortUnavailable(AgentError):
    pass


class ChangeRefused(AgentError):
    pass


class ChangeFailed(AgentError):
    def __init__(self, message: str, *, restored: bool) -> None:
        super().__init__(
            message
            + ("; the snapshot was restored" if restored else "; restoring the snapshot failed too")
        )
        self.restored = restored


class NoSnapshot(AgentError):
    pass


class BenchmarkRefused(AgentError):
    pass


class BenchmarkFailed(AgentError):
    pass


class ServiceError(AgentError):
    pass


class ServiceUnreachable(ServiceError):
    pass


class ServiceRejected(ServiceError):
    def __init__(self, status: int, error: str, detail: str, request_id: str = "") -> None:
        named = f" (request {request_id})" if request_id else ""
        super().__init__(f"{status} {error}: {detail}{named}")
        self.status = status
        self.error = error
        self.detail = detail
        self.request_id = request_id  # the service's log lines for this call carry it


class RateLimited(ServiceRejected):
    """The service said 429 (over the rate limit) or 503 (its database is away): retry after
    `retry_after` seconds. Raised as well, without a request, for calls made before that time
    has passed."""

    def __init__(
        self,
        retry_after: float,
        detail: str,
        request_id: str = "",
        *,
        status: int = 429,
        error: str = "rate_limited",
    ) -> None:
        super().__init__(status, error, detail, request_id)
        self.retry_after = retry_after
