"""What the operator commands share: the service's URL and token, and one request helper
that turns the service's errors into a message and an exit status."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

Url = Annotated[str, typer.Option(envvar="BLKPILOT_URL", help="The blkpilot service.")]
Token = Annotated[
    str,
    typer.Option(
        envvar="BLKPILOT_TOKEN",
        help="An operator API token. Without it: the file BLKPILOT_TOKEN_FILE names, or"
        " ~/.config/blkpilot/token (a token on the command line is in `ps` for all to see).",
    ),
]
Reason = Annotated[str, typer.Option(help="Why, for the audit log (3 characters or more).")]


class Format(StrEnum):
    """How a listing is printed: a table (ids shortened to what the other commands take), a
    wide one (every id and text whole), or the API's JSON, for scripts."""

    TABLE = "table"
    WIDE = "wide"
    JSON = "json"


Output = Annotated[
    Format,
    typer.Option(
        "--output", "-o", help="table, wide (every id and text whole) or json (the API's)."
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="The same as --output json.")]


def output_format(output: Format, as_json: bool) -> Format:
    return Format.JSON if as_json else output


def shown_id(ident: str, output: Format) -> str:
    """An id as a listing shows it: its first 8 characters (which commands take), whole when
    wide."""
    return ident if output is Format.WIDE else ident[:8]


DEFAULT_URL = "http://127.0.0.1:8000"


TOKEN_FILE = Path("~/.config/blkpilot/token")


def credential(given: str) -> str:
    """The token given, or the one in BLKPILOT_TOKEN_FILE (exit status 2 if it names no
    readable file), or in ~/.config/blkpilot/token where there is one; else none."""
    if given:
        return given
    named = os.environ.get("BLKPILOT_TOKEN_FILE")
    path = Path(named) if named else TOKEN_FILE.expanduser()
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        if not named:
            return ""
        typer.secho(f"BLKPILOT_TOKEN_FILE: {path} does not exist", err=True, fg="red")
        raise typer.Exit(code=2) from None
    except OSError as error:
        typer.secho(f"cannot read the token in {path}: {error}", err=True, fg="red")
        raise typer.Exit(code=2) from error
    if path.stat().st_mode & 0o077:
        typer.secho(f"warning: {path} is readable by others (chmod 600 it)", err=True, fg="yellow")
    return text


def api(url: str, token: str, method: str, path: str, **kwargs: Any) -> object:
    """The JSON answer; exit status 2 if the service cannot be reached, 1 if it refused."""
    import httpx

    token = credential(token)
    if not token:
        typer.secho(
            "no API token: set BLKPILOT_TOKEN, name a file holding one in BLKPILOT_TOKEN_FILE,"
            f" or put it in {TOKEN_FILE} (chmod 600); an admin makes one with"
            " `blkpilot token create --name you --role operator`",
            err=True,
            fg=typer.colors.RED,
        )
        raise typer.Exit(code=2)
    try:
        response = httpx.request(
            method,
            f"{url.rstrip('/')}/api/v1{path}",
            timeout=30,
            headers={"Authorization": f"Bearer {token}"},
            **kwargs,
        )
    except httpx.HTTPError as error:
        typer.secho(f"cannot reach {url}: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from error
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        typer.secho(f"{response.status_code}: {detail}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=1)
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


def pages(url: str, token: str, path: str) -> list[dict[str, Any]]:
    """Every item of an API listing, a thousand at a time."""
    found: list[dict[str, Any]] = []
    while True:
        page = api(url, token, "GET", path, params={"limit": 1000, "offset": len(found)})
        assert isinstance(page, list)
        found += page
        if len(page) < 1000:
            return found


def resolve_id(url: str, token: str, collection: str, given: str, what: str) -> str:
    """A full id from the id or the short one a listing shows (its first characters): the
    one item of `collection` (an API path listing items with an "id") it begins; exit status
    1, saying why, for none or several."""
    import uuid

    try:
        return str(uuid.UUID(given))
    except ValueError:
        pass
    prefix = given.strip().lower()
    if len(prefix) < 4 or any(c not in "0123456789abcdef-" for c in prefix):
        typer.secho(f"{given!r} is not a {what} id or the start of one", err=True, fg="red")
        raise typer.Exit(code=1)
    found = [str(i["id"]) for i in pages(url, token, collection) if str(i["id"]).startswith(prefix)]
    if len(found) == 1:
        return found[0]
    why = (
        f"no {what} id begins {prefix!r}"
        if not found
        else (f"{len(found)} {what} ids begin {prefix!r}: give more of it")
    )
    typer.secho(why, err=True, fg="red")
    raise typer.Exit(code=1)


def labels_option(labels: list[str]) -> dict[str, str]:
    """`--label key=value` options, or the option's error."""
    from agent.contract.labels import parse_labels

    try:
        return parse_labels(labels)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--label") from error


def console() -> Any:
    """Where tables go: on a terminal, as wide as it is; piped or redirected, every column
    whole (rich would cut them to 80 columns: "devi…", "obje…")."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=100_000, soft_wrap=True)
