"""`blkpilot token …`: operator API tokens, through the API like every other daily command
(an admin token: BLKPILOT_TOKEN or its file). `token create --bootstrap` alone works on the
database directly: on the service host, for the first admin token, before there is one to
call the API with."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from service.cli.apiclient import DEFAULT_URL, Token, Url, api

app = typer.Typer(
    help="Operator API tokens (through the API; an admin token).", no_args_is_help=True
)

TtlHours = Annotated[
    float,
    typer.Option(
        min=0,
        max=24 * 3650,
        help="Hours until the token expires; 0: never.",
        show_default="2160, 90 days",
    ),
]
ROLES = ("viewer", "operator", "admin")


def _ttl(hours: float) -> float | None:
    return hours if hours > 0 else None


@app.command("create")
def create(
    name: Annotated[str, typer.Option(help="A unique name, shown in the audit log.")],
    role: Annotated[str, typer.Option(help="viewer, operator or admin.")] = "viewer",
    ttl_hours: TtlHours = 24 * 90,
    bootstrap: Annotated[
        bool,
        typer.Option(
            "--bootstrap",
            help="On the service host, for the first admin token: write it to the database"
            " (BLKPILOT_DATABASE_URL, or the embedded one in BLKPILOT_DATA_DIR) directly,"
            " without the API. Every other token goes through the API.",
        ),
    ] = False,
    url: Url = DEFAULT_URL,
    token: Token = "",
) -> None:
    """Create an API token; its secret is printed once."""
    if role not in ROLES:
        raise typer.BadParameter(f"{role!r}: one of {', '.join(ROLES)}")
    if bootstrap:
        typer.echo(_bootstrap(name, role, ttl_hours))
        return
    made = api(
        url, token, "POST", "/api-tokens",
        json={"name": name, "role": role, "ttl_hours": _ttl(ttl_hours)},
    )  # fmt: skip
    assert isinstance(made, dict)
    typer.echo(made["token"])


def _bootstrap(name: str, role: str, ttl_hours: float) -> str:
    from datetime import timedelta

    from service.cli.server import load_settings
    from service.errors import BlkpilotError
    from service.runtime import open_database
    from service.security import Role
    from service.tokens import service

    ttl = timedelta(hours=ttl_hours) if ttl_hours > 0 else None
    with open_database(load_settings()) as database, database.sessionmaker.begin() as session:
        try:
            _, secret = service.create_api_token(
                session, "cli", name=name, role=Role(role), ttl=ttl
            )
        except BlkpilotError as error:
            typer.secho(f"error: {error.detail}", err=True, fg=typer.colors.RED)
            raise typer.Exit(code=1) from error
    return secret


def _state(token: dict[str, Any], now: datetime) -> str:
    """As the service judges the token: revoked, expired (refused as such), or active."""
    if token.get("revoked_at"):
        return "revoked"
    expires = token.get("expires_at")
    if expires and datetime.fromisoformat(expires) <= now:
        return "expired"
    return "active"


def _when(value: str | None, none: str) -> str:
    if not value:
        return none
    return f"{datetime.fromisoformat(value).astimezone(UTC):%Y-%m-%d %H:%M} UTC"


@app.command("list")
def list_tokens(url: Url = DEFAULT_URL, token: Token = "") -> None:
    """Every API token: name, role, state (active, expired, revoked), when it expires and
    when it was last used (UTC)."""
    now = datetime.now(UTC)
    tokens = api_list(url, token)
    rows = [
        (t["name"], t["role"], _state(t, now), _when(t.get("expires_at"), "never"),
         _when(t.get("last_used_at"), "not yet"))
        for t in tokens
    ]  # fmt: skip
    header = ("NAME", "ROLE", "STATE", "EXPIRES", "LAST USED")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        typer.echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _by_name(url: str, token: str, name: str) -> dict[str, Any]:
    """The token of that name not yet revoked (exit status 1 if there is none)."""
    found = [t for t in api_list(url, token) if t["name"] == name and not t.get("revoked_at")]
    if not found:
        typer.secho(f"error: no active API token named {name!r}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=1)
    return found[0]


def api_list(url: str, token: str) -> list[dict[str, Any]]:
    tokens = api(url, token, "GET", "/api-tokens")
    assert isinstance(tokens, list)
    return tokens


@app.command("rotate")
def rotate(
    name: Annotated[str, typer.Argument(help="The token's name (`token list`).")],
    ttl_hours: TtlHours = 24 * 90,
    url: Url = DEFAULT_URL,
    token: Token = "",
) -> None:
    """A new secret for the token (same name and role), printed once; the old secret stops
    working at once. Exit status 1 if there is no active token of that name."""
    found = _by_name(url, token, name)
    made = api(
        url, token, "POST", f"/api-tokens/{found['id']}/rotate",
        json={"ttl_hours": _ttl(ttl_hours)},
    )  # fmt: skip
    assert isinstance(made, dict)
    typer.echo(made["token"])


@app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="The token's name (`token list`).")],
    url: Url = DEFAULT_URL,
    token: Token = "",
) -> None:
    """Revoke an API token now. Exit status 1 if there is no active token of that name."""
    found = _by_name(url, token, name)
    api(url, token, "DELETE", f"/api-tokens/{found['id']}")
    typer.echo(f"revoked {name}")
