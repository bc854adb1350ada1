"""How another owner of a device's queue attributes is said to people — the CLI, the dashboard
and the agent's log say it alike: "udev rule 60-ioschedulers.rules:3 (scheduler=bfq)". Plain
functions over the owner's fields (wire.Owner, or its JSON), importing nothing, so that the
command line reads it without loading the protocol's models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_KINDS = {"udev": "udev rule", "tuned": "TuneD profile"}


def owned_by(owner: Mapping[str, Any]) -> str:
    kind = str(owner.get("kind", ""))
    settings = ", ".join(f"{k}={v}" for k, v in dict(owner.get("settings") or {}).items())
    said = f"{_KINDS.get(kind, kind)} {owner.get('source', '')} ({settings})"
    return said if owner.get("certain", True) else f"{said}, may apply"
