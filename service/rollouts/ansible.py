"""Running blkpilot's playbooks with ansible-runner, and reading each host's and device's
outcome from its events.

The inventory is written for each run from what the service knows (hosts are nodes' hostnames,
each with the devices the run changes) merged with connection variables from an operator's
file (BLKPILOT_ROLLOUT_HOST_VARS: `all:` for every host, and a section per hostname)."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

log = logging.getLogger(__name__)

Result = Literal["pass", "fail", "inconclusive", "restored", "error", "not_run"]
CANARY_TASK = "blkpilot canary"
RESTORE_TASK = "blkpilot restore"
# `agent canary`'s exit statuses; 4, could not run (no eBPF, too little traffic to judge, the
# device held): no verdict, the stage waits for an operator as for a host not reached
_CANARY_RC: dict[int, Result] = {0: "pass", 1: "fail", 3: "inconclusive", 4: "not_run"}


@dataclass(frozen=True)
class Outcome:
    hostname: str
    device: str
    result: Result
    detail: str


@dataclass
class RunReport:
    outcomes: list[Outcome]
    status: str  # ansible-runner's: successful, failed, canceled, timeout
    rc: int | None
    artifacts: Path


def default_playbooks_dir() -> Path:
    """The checkout's playbooks (./playbooks); a wheel does not carry them."""
    return Path(__file__).resolve().parents[2] / "playbooks"


def load_host_vars(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None:
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path}: expected a mapping of host (or 'all') to variables")
    return data


def _canary_detail(stdout: str) -> str:
    """The verdict line and the metrics that did not pass."""
    lines = stdout.splitlines()
    kept = [line for line in lines if line.startswith("verdict:")]
    kept += [line for line in lines if '"verdict": "fail"' in line or '"inconclusive"' in line]
    return "\n".join(kept)[:2000]


class PlaybookRunner:
    def __init__(
        self, playbooks_dir: Path, work_dir: Path, host_vars: Mapping[str, Mapping[str, Any]]
    ) -> None:
        self.playbooks_dir = playbooks_dir
        self.work_dir = work_dir
        self.host_vars = host_vars
        binary = Path(sys.executable).parent / "ansible-playbook"
        found = str(binary) if binary.exists() else shutil.which("ansible-playbook")
        if found is None:
            raise RuntimeError("ansible-playbook not found (install blkpilot's server extra)")
        self.binary = found

    def inventory(self, targets: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        shared = dict(self.host_vars.get("all", {}))
        hosts = {
            host: {**shared, **self.host_vars.get(host, {}), "blkpilot_devices": list(devices)}
            for host, devices in sorted(targets.items())
        }
        return {"all": {"hosts": hosts}}

    def run(
        self,
        playbook: str,
        targets: Mapping[str, Sequence[str]],
        extravars: Mapping[str, Any],
        *,
        ident: str,
        cancel: Callable[[], bool],
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> RunReport:
        """Each device's outcome goes to on_outcome as soon as its task item ends."""
        import ansible_runner

        events: list[dict[str, Any]] = []

        def keep(event: dict[str, Any]) -> bool:
            if event.get("event", "").startswith("runner_"):
                events.append(event)
                outcome = self._item_outcome(event, playbook)
                if outcome is not None and on_outcome is not None:
                    on_outcome(outcome)
            return True

        private = self.work_dir / ident
        private.mkdir(parents=True, exist_ok=True)
        runner = ansible_runner.run(
            private_data_dir=str(private),
            project_dir=str(self.playbooks_dir),
            playbook=playbook,
            inventory=self.inventory(targets),
            extravars={**extravars, "rollout_hosts": ",".join(sorted(targets))},
            envvars={
                "ANSIBLE_CONFIG": str(self.playbooks_dir / "ansible.cfg"),
                "ANSIBLE_ROLES_PATH": str(self.playbooks_dir / "roles"),
                "ANSIBLE_NOCOLOR": "1",
                # ansible-runner starts ansible-playbook from PATH: ours first
                "PATH": f"{Path(self.binary).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            },
            ident="run",
            event_handler=keep,
            cancel_callback=cancel,
            quiet=True,
            suppress_env_files=True,
        )
        outcomes = self._outcomes(events, targets, playbook)
        return RunReport(outcomes, str(runner.status), runner.rc, private / "artifacts" / "run")

    @staticmethod
    def _item_outcome(event: dict[str, Any], playbook: str) -> Outcome | None:
        """A device's outcome, if the event is the end of its canary (or restore) item."""
        task = RESTORE_TASK if playbook == "rollback.yml" else CANARY_TASK
        data = event.get("event_data", {})
        kind = event.get("event")
        if kind not in ("runner_item_on_ok", "runner_item_on_failed") or data.get("task") != task:
            return None
        host, res = str(data.get("host", "")), data.get("res", {}) or {}
        device = str(res.get("item", ""))
        if task == RESTORE_TASK:
            ok = kind == "runner_item_on_ok"
            result: Result = "restored" if ok else "error"
            detail = "put back as found" if res.get("changed") else "nothing to put back"
            if not ok:
                detail = (res.get("stderr") or res.get("msg") or "")[-2000:]
        else:
            rc = res.get("rc")
            result = _CANARY_RC.get(rc, "error") if isinstance(rc, int) else "error"
            detail = _canary_detail(res.get("stdout", ""))
            if result in ("error", "not_run"):
                detail = (res.get("stderr") or res.get("msg") or str(rc))[-2000:]
        return Outcome(host, device, result, detail)

    @classmethod
    def _outcomes(
        cls, events: list[dict[str, Any]], targets: Mapping[str, Sequence[str]], playbook: str
    ) -> list[Outcome]:
        task = RESTORE_TASK if playbook == "rollback.yml" else CANARY_TASK
        found: dict[tuple[str, str], Outcome] = {}
        host_error: dict[str, str] = {}
        for event in events:
            data = event.get("event_data", {})
            host, res = data.get("host", ""), data.get("res", {}) or {}
            kind = event["event"]
            outcome = cls._item_outcome(event, playbook)
            if outcome is not None:
                found[(outcome.hostname, outcome.device)] = outcome
            elif kind == "runner_on_unreachable":
                host_error[host] = f"unreachable: {res.get('msg', '')}"[:2000]
            elif kind == "runner_on_failed" and data.get("task") != task:
                host_error.setdefault(host, f"{data.get('task')}: {res.get('msg', '')}"[:2000])
        outcomes = []
        for host, devices in sorted(targets.items()):
            for device in devices:
                if (host, device) in found:
                    outcomes.append(found[(host, device)])
                elif host in host_error:
                    outcomes.append(Outcome(host, device, "error", host_error[host]))
                else:
                    outcomes.append(Outcome(host, device, "not_run", "the play stopped first"))
        return outcomes
