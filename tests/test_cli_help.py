"""The CLI's help, as an operator reads it: every command says what it does, and defaults
survive rich's markup (help text with "[default: 8000]" read "Port ." — the brackets were
taken for markup)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from service.cli import app


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command and group under this one (typer's own click: duck-typed)."""
    found = []
    for name, command in group.commands.items():
        found.append(((*path, name), command))
        if hasattr(command, "commands"):
            found += _commands(command, (*path, name))
    return found


def test_every_command_says_what_it_does() -> None:
    commands = _commands(typer.main.get_command(app))
    assert len(commands) > 40
    silent = [" ".join(path) for path, command in commands if not (command.help or "").strip()]
    assert silent == []


def test_defaults_are_shown_whole() -> None:
    shown = CliRunner().invoke(app, ["serve", "--help"], terminal_width=120)
    assert shown.exit_code == 0
    assert "127.0.0.1" in shown.output
    assert "8000" in shown.output
    assert "Port ." not in shown.output


def test_no_token_is_said_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no token anywhere, an API command says so and where to put one (it said "cannot
    reach …: Illegal header value b'Bearer '"), and sends nothing: exit status 2."""
    import httpx

    monkeypatch.delenv("BLKPILOT_TOKEN", raising=False)
    monkeypatch.delenv("BLKPILOT_TOKEN_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/blkpilot/token

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a request was sent without a token")

    monkeypatch.setattr(httpx, "request", refuse)
    shown = CliRunner().invoke(app, ["nodes", "list", "--url", "http://127.0.0.1:9"])
    assert shown.exit_code == 2, shown.output
    assert "no API token" in shown.output
    assert "BLKPILOT_TOKEN" in shown.output
    assert "Illegal header" not in shown.output
