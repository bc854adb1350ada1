"""What the operator commands share: the service's URL and token, and one request helper
that turns the service's errors into a message and an exit status."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from agent.contract.labels import parse_labels

Url = Annotated[str, typer.Option(envvar="BLKPILOT_URL", help="The blkpilot service.")]
Token = Annotated[str, typer.Option(envvar="BLKPILOT_TOKEN", help="An operator API token.")]
Reason = Annotated[str, typer.Option(help="Why, for the audit log (3 characters or more).")]
DEFAULT_URL = "http://127.0.0.1:8000"


def api(url: str, token: str, method: str, path: str, **kwargs: Any) -> object:
    """The JSON answer; exit status 2 if the service cannot be reached, 1 if it refused."""
    import httpx

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
    return response.json()


def labels_option(labels: list[str]) -> dict[str, str]:
    """`--label key=value` options, or the option's error."""
    try:
        return parse_labels(labels)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--label") from error
