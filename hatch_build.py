"""The wheel's build hook: the agent's eBPF object is compiled into the wheel (it is a build
artifact, not kept in git), so that a node installed with `pip install blkpilot[agent]` has
its live canary. No clang and no object: the build fails and says why."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

OBJECTS = {"agent/ebpf/blklat.bpf.c": "agent/ebpf/blklat.bpf.o"}


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        for source, built in OBJECTS.items():
            src, obj = root / source, root / built
            stale = not obj.exists() or obj.stat().st_mtime < src.stat().st_mtime
            if stale:
                if shutil.which("clang") is None:
                    raise RuntimeError(
                        f"{built} must be compiled into the wheel and clang is not installed"
                        " (apt-get install clang libbpf-dev, or run `make setup`)"
                    )
                subprocess.run(["sh", str(root / "agent/ebpf/build.sh"), str(src), str(obj)],
                               check=True)  # fmt: skip
            build_data["artifacts"].append(built)
