"""The CLI's help, as an operator reads it: every command says what it does, and defaults
survive rich's markup (help text with "[default: 8000]" read "Port ." — the brackets were
taken for markup)."""

from __future__ import annotations

from typing import Any

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
