"""One typed configuration for the service, read from BLKPILOT_* environment variables — and
from files: a setting may instead be a file named blkpilot_<setting> in $CREDENTIALS_DIRECTORY,
where systemd's LoadCredential= puts them (playbooks/roles/blkpilot_service), so that a secret
such as the database URL's password is in neither the unit nor the environment that the
rollout worker's ansible-runner processes inherit."""

from __future__ import annotations

import os
from datetime import timedelta
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.nodes.tokens import Lifetime

if TYPE_CHECKING:
    from service.telemetry.retention import RetentionPolicy


class Environment(StrEnum):
    DEVELOPMENT = "development"
    PRODUCTION = "production"


def _default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "blkpilot"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BLKPILOT_", extra="ignore")

    environment: Environment = Environment.DEVELOPMENT
    log_format: Literal["json", "text"] = "json"  # BLKPILOT_LOG_FORMAT=text for a terminal
    # Unset: an embedded PostgreSQL (pgserver) is started in data_dir.
    database_url: str | None = None
    data_dir: Path = Field(default_factory=_default_data_dir)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65_535)
    # https: the service serves TLS itself with this certificate (chain, PEM) and key; or it
    # sits behind a proxy that terminates TLS (docs/deploy.md) and both stay unset
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    # the connections the pool keeps open, and those it may open beyond them at a peak — each
    # closed as soon as it is returned: under a steady load past the pool every overflow
    # checkout is a new PostgreSQL backend. 1,500 enrolments 64 at a time on two cores: with
    # 10 + 10, 820-902 sessions and 6.6-7.4 ms of PostgreSQL's CPU a node; with 10 + 0, 7
    # sessions, 2.8-3.3 ms and the most nodes a second (91-106; 20 + 0 made 84-95: more
    # backends than cores). A replica admits pool + overflow requests at once.
    db_pool_size: int = Field(default=10, ge=1, le=200)
    db_max_overflow: int = Field(default=0, ge=0, le=200)
    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1_024)
    # per bearer token (unauthenticated callers: per address), in each service process;
    # `limits`' notation. An agent makes a few requests per push interval.
    rate_limit: str = "50/second;1000/minute"
    # a node token's lifetime; its agent renews it after two thirds of it
    node_token_ttl_hours: float = Field(default=24.0 * 30, gt=0, le=24 * 365)
    # how long the token a renewal replaced is still accepted
    node_token_grace_seconds: float = Field(default=600.0, ge=0, le=7 * 24 * 3600)
    enrollment_token_ttl_hours: float = Field(default=24.0, gt=0, le=24 * 30)
    # Rollouts: `serve` runs a worker that carries them out with ansible-runner.
    rollout_worker: bool = True
    # runs the nightly jobs operators queue through the API (POST /api/v1/nightly-runs)
    nightly_worker: bool = True
    playbooks_dir: Path | None = None  # default: the playbooks shipped with blkpilot
    # Connection variables for the rollout inventory (YAML: `all:` and a section per host).
    rollout_host_vars: Path | None = None
    rollout_poll_seconds: float = Field(default=2.0, gt=0, le=3_600)
    rollout_lease_seconds: float = Field(default=30.0, ge=5, le=3_600)
    # Telemetry retention (service/telemetry/retention.py): raw windows by day, hourly rollups
    # by month; `serve` runs the upkeep every telemetry_upkeep_seconds (one replica at a time)
    telemetry_raw_days: int = Field(default=14, ge=1, le=3_650)
    telemetry_hourly_days: int = Field(default=400, ge=1, le=36_500)
    telemetry_upkeep_seconds: float = Field(default=300.0, ge=1, le=86_400)
    # how long `serve` keeps an idle connection open: longer than its clients keep one for
    # reuse (httpx: 5 s), or a client reusing one as the server closes it gets a reset
    # (uvicorn's own default is also 5 s: the race bench/fleet.py hit about once in 5 runs)
    keep_alive_seconds: int = Field(default=15, ge=1, le=3_600)

    @property
    def retention(self) -> RetentionPolicy:
        from service.telemetry.retention import RetentionPolicy

        return RetentionPolicy(self.telemetry_raw_days, self.telemetry_hourly_days)

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        given = [p for p in (self.tls_certfile, self.tls_keyfile) if p is not None]
        if len(given) == 1:
            raise ValueError("BLKPILOT_TLS_CERTFILE and BLKPILOT_TLS_KEYFILE go together")
        for path in given:
            if not path.is_file():
                raise ValueError(f"TLS file {path} does not exist")
        return self

    @model_validator(mode="after")
    def _rate_limit_parses(self) -> Self:
        from limits import parse_many

        try:
            if not parse_many(self.rate_limit):
                raise ValueError("empty")
        except ValueError as error:
            raise ValueError(
                f"BLKPILOT_RATE_LIMIT {self.rate_limit!r} is not a rate limit such as"
                f" '50/second;1000/minute': {error}"
            ) from None
        return self

    @model_validator(mode="after")
    def _refuse_unsafe_defaults(self) -> Self:
        if self.environment is Environment.PRODUCTION and self.database_url is None:
            raise ValueError(
                "BLKPILOT_DATABASE_URL must name a PostgreSQL server in production;"
                " the embedded database is for development and demos"
            )
        return self


def token_lifetime(settings: Settings) -> Lifetime:
    return Lifetime(
        timedelta(hours=settings.node_token_ttl_hours),
        timedelta(seconds=settings.node_token_grace_seconds),
    )


def load() -> Settings:
    """The settings from the environment and, under systemd, its credentials directory (an
    environment variable wins over a file of the same setting)."""
    return Settings(_secrets_dir=os.environ.get("CREDENTIALS_DIRECTORY"))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load()
