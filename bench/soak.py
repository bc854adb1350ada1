"""A compressed soak: a service and three agents (real processes, each with its own tmpfs loop
device and state, one inventory host each) run for --seconds while faults come on a schedule:

- PostgreSQL restarted (`pg_ctl restart -m fast`) while the agents send telemetry;
- the service restarted (SIGTERM, start) while a staged rollout is changing a device;
- an agent killed (SIGKILL) while it applies a policy, then started again.

Recorded: telemetry windows stored against the time each agent ran — a gap in a device's
windows that no agent downtime explains is a lost window, an overlap a duplicate —, every apply
finished or restored (each device ends on its policy, reported applied, no journal left), and
the service's 5xx answers outside its own and PostgreSQL's restarts.

    python -m bench.soak                      # 20 minutes
    python -m bench.soak --seconds 60 --once --no-record   # the suite's short version
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.record import provenance, record
from bench.unwind import on_termination
from kernel.lab import devices as lab
from tests.proc import free_port, wait_ready

BLKPILOT = str(Path(sys.executable).parent / "blkpilot")
HOSTS = ("soak-a", "soak-b", "soak-c")
INTERVAL_S = 1.0
MARGIN_S = 3.0  # around a restart: answers in flight may fail
# every device's scheduler before any policy: what a device no policy reached must still be on
# (a rollout rolled back restores it; on a loaded host, 2026-11-30, the first one was)
BASELINE = "bfq"
WORKLOAD = "hs23-single-randread-4k-qd32"


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


@dataclass
class Host:
    name: str
    device: str
    backing: Path
    state_dir: Path
    config: Path
    device_id: str = ""
    process: subprocess.Popen[bytes] | None = None
    down: list[tuple[float, float]] = field(default_factory=list)  # wall-clock intervals

    def start(self) -> None:
        with (self.state_dir / "agent.log").open("ab") as out:
            argv = [BLKPILOT, "agent", "run", "--state-dir", str(self.state_dir)]
            self.process = subprocess.Popen(
                [*argv, "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def scheduler(self) -> str:
        text = Path(f"/sys/block/{self.device}/queue/scheduler").read_text()
        return text.split("[")[1].split("]")[0]


class Soak:
    def __init__(self, base: Path, seconds: float) -> None:
        self.base = base
        self.seconds = seconds
        self.data_dir = base / "service"
        self.data_dir.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.service: subprocess.Popen[bytes] | None = None
        self.outages: list[tuple[float, float, str]] = []  # wall clock: service or database
        self.hosts: dict[str, Host] = {}
        self.admin = ""
        self.events: list[dict[str, Any]] = []
        self.host_vars = base / "host_vars.json"

    # --- processes ----------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLKPILOT_")}
        env.update(
            BLKPILOT_DATA_DIR=str(self.data_dir),
            BLKPILOT_ROLLOUT_HOST_VARS=str(self.host_vars),
            BLKPILOT_ROLLOUT_POLL_SECONDS="0.5",
            BLKPILOT_ROLLOUT_LEASE_SECONDS="10",
            BLKPILOT_LOG_FORMAT="json",
        )
        return env

    def start_service(self) -> None:
        with (self.data_dir / "serve.log").open("ab") as out:
            self.service = subprocess.Popen(
                [BLKPILOT, "serve", "--port", str(self.port)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_ready(f"{self.url}/readyz", self.service)
        except AssertionError as error:
            raise SystemExit(f"blkpilot serve: {error}") from None

    def stop_service(self) -> None:
        assert self.service is not None
        self.service.send_signal(signal.SIGTERM)
        self.service.wait(timeout=120)
        self.service = None

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin}"}
        return httpx.request(
            method, f"{self.url}/api/v1{path}", headers=headers, timeout=30, **kwargs
        )

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [BLKPILOT, *args], env=self.env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"blkpilot {' '.join(args)}: {done.stderr}")
        return done.stdout

    # --- set-up -------------------------------------------------------------------------------

    def set_up(self) -> None:
        variables: dict[str, Any] = {
            "all": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "blkpilot_cli": BLKPILOT,
            }
        }
        for name in HOSTS:
            backing = lab.TMPFS / f"blkpilot-soak-{uuid.uuid4().hex[:8]}.img"
            device = lab.attach(backing, 64 << 20, direct_io=True)
            # on bfq: the first rollout (none) is a gain its canaries can show, the second
            # (mq-deadline, a loss against none here) is rolled back
            Path(f"/sys/block/{device}/queue/scheduler").write_text(BASELINE)
            state_dir = self.base / name
            state_dir.mkdir()
            config = state_dir / "agent.toml"
            config.write_text(
                f'devices = ["{device}"]\n'
                f"interval_s = {INTERVAL_S}\npush_interval_s = 2.0\npolicy_interval_s = 1.0\n"
                f"inventory_interval_s = 60.0\nmetrics_port = 0\nebpf = false\n"
                'log_format = "json"\n[power]\nrapl = false\nhwmon = false\nipmi = false\n'
            )
            self.hosts[name] = Host(name, device, backing, state_dir, config)
            variables[name] = {"blkpilot_state_dir": str(state_dir)}
        self.host_vars.write_text(json.dumps(variables))
        self.start_service()
        made = self.cli("token", "create", "--bootstrap", "--name", "soak", "--role", "admin")
        self.admin = made.split()[-1]
        self.label = uuid.uuid4().hex[:8]
        for host in self.hosts.values():
            token = self.api("POST", "/enrollment-tokens", json={}).json()["token"]
            self.cli(
                "agent", "enroll", "--server", self.url, "--token", token,
                "--state-dir", str(host.state_dir), "--hostname", host.name,
                "--label", f"fleet={self.label}",
            )  # fmt: skip
            host.start()
        deadline = time.monotonic() + 60
        for host in self.hosts.values():
            while not host.device_id and time.monotonic() < deadline:
                node = self.api("GET", "/nodes", params={"hostname": host.name}).json()
                if node:
                    found = self.api("GET", f"/nodes/{node[0]['id']}/devices").json()
                    host.device_id = found[0]["id"] if found else ""
                time.sleep(0.5)
            if not host.device_id:
                raise SystemExit(f"{host.name} never reported its device")

    def tear_down(self) -> None:
        for host in self.hosts.values():
            if host.process is not None and host.process.poll() is None:
                host.process.send_signal(signal.SIGTERM)
                host.process.wait(timeout=60)
        if self.service is not None:
            self.stop_service()
        for host in self.hosts.values():
            lab.detach(host.device, host.backing)

    # --- faults -------------------------------------------------------------------------------

    def restart_database(self) -> None:
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        started = time.time()
        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=self.data_dir / "postgres", user="pgserver")
        self.outages.append((started, time.time(), "database"))
        self.events.append({"fault": "database restarted", "seconds": time.time() - started})
        log(f"PostgreSQL restarted in {time.time() - started:.1f} s")

    def rollout_with_service_restart(self, scheduler: str) -> None:
        body = {
            "name": f"soak-{uuid.uuid4().hex[:6]}",
            "reason": "soak",
            "config": {"scheduler": scheduler},
            "target": {"node_labels": {"fleet": self.label}},
            "stages": ["1", "100%"],
            "serial": "1",
            "soak_seconds": 1,
            "canary": {"rounds": 6, "round_seconds": 0.5, "workload": WORKLOAD},
        }
        created = self.api("POST", "/rollouts", json=body)
        if created.status_code != 201:
            raise SystemExit(f"rollout refused: {created.text}")
        rollout_id = created.json()["id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until a device is being changed
            row = self.api("GET", f"/rollouts/{rollout_id}").json()
            if any(t["status"] == "changing" for t in row["targets"]):
                break
            time.sleep(0.2)
        started = time.time()
        self.stop_service()
        self.start_service()
        self.outages.append((started, time.time(), "service"))
        log(f"service restarted mid-rollout in {time.time() - started:.1f} s")
        status, resumes = "", 0
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            row = self.api("GET", f"/rollouts/{rollout_id}").json()
            status = row["status"]
            if status in ("succeeded", "rolled_back", "failed"):
                break
            if status == "paused" and resumes < 3:
                resumes += 1
                self.api("POST", f"/rollouts/{rollout_id}/resume", json={"reason": "again"})
            elif status == "paused":
                self.api("POST", f"/rollouts/{rollout_id}/abort", json={"reason": "soak ends it"})
            time.sleep(1)
        self.events.append(
            {"fault": "service restarted mid-rollout", "rollout": status, "resumes": resumes}
        )
        log(f"rollout to {scheduler}: {status} ({resumes} resumes)")

    def kill_agent_during_apply(self, host: Host, scheduler: str) -> None:
        """A policy for the device, and the agent killed as it applies it: the journal is
        watched, and the kill lands while it exists (up to 5 tries, each a new policy)."""
        journal = host.state_dir / "journal.json"
        hit = False
        for attempt in range(5):
            wanted = scheduler if attempt % 2 == 0 else "mq-deadline"
            body = {"config": {"scheduler": wanted}, "reason": "soak: an apply to interrupt"}
            response = self.api("PUT", f"/devices/{host.device_id}/policy", json=body)
            if response.status_code != 200:
                raise SystemExit(f"policy refused: {response.text}")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not journal.exists():
                time.sleep(0.0005)
            assert host.process is not None
            killed = time.time()
            host.process.send_signal(signal.SIGKILL)
            host.process.wait()
            hit = journal.exists()
            time.sleep(2 * INTERVAL_S)
            host.start()
            host.down.append((killed, time.time()))
            log(f"{host.name} killed {'during' if hit else 'after'} an apply; started again")
            if hit:
                break
            time.sleep(2)
        self.events.append({"fault": "agent killed during an apply", "hit": hit})

    # --- the run --------------------------------------------------------------------------------

    def run(self, once: bool = False) -> dict[str, Any]:
        started = time.monotonic()
        a, b, _ = self.hosts.values()
        schedule = [
            (0.10, self.restart_database),
            (0.20, lambda: self.rollout_with_service_restart("none")),
            (0.45, lambda: self.kill_agent_during_apply(a, "kyber")),
            (0.55, self.restart_database),
            (0.65, lambda: self.rollout_with_service_restart("mq-deadline")),
            (0.85, lambda: self.kill_agent_during_apply(b, "kyber")),
        ]
        if once:  # each fault once: the suite's short version
            schedule = schedule[:3]
        for at, fault in schedule:
            while time.monotonic() - started < at * self.seconds:
                time.sleep(0.5)
                self.check_agents()
            fault()
            self.settle()  # one fault at a time: each is met from a steady state
        while time.monotonic() - started < self.seconds:
            time.sleep(0.5)
            self.check_agents()
        self.settle()
        wall = time.monotonic() - started
        for host in self.hosts.values():  # SIGTERM: each sends what it holds
            assert host.process is not None
            host.process.send_signal(signal.SIGTERM)
            host.process.wait(timeout=60)
        return self.account(wall)

    def settle(self, timeout: float = 60) -> None:
        """Until every agent's spool is down to what one push interval collects and every
        policy is applied (or a minute)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_agents()
            # agents spool each window as collected and send every push: a few batches wait
            spooled = any(
                len(list((h.state_dir / "spool").glob("*.json"))) > 3 for h in self.hosts.values()
            )
            policies = [
                self.api("GET", f"/devices/{h.device_id}/policy") for h in self.hosts.values()
            ]
            pending = any(r.status_code == 200 and not r.json()["in_sync"] for r in policies)
            if not spooled and not pending:
                return
            time.sleep(0.5)
        log("not settled within a minute")

    def check_agents(self) -> None:
        for host in self.hosts.values():
            if host.process is not None and host.process.poll() is not None:
                raise SystemExit(f"{host.name}'s agent died: {host.process.returncode}")

    def account(self, wall: float) -> dict[str, Any]:
        lost = duplicated = explained = windows = 0
        per_host = {}
        for host in self.hosts.values():
            rows = self.telemetry(host.device_id)
            spans = sorted(
                (datetime.fromisoformat(w["window_start"]).timestamp(),
                 datetime.fromisoformat(w["window_end"]).timestamp())
                for w in rows
            )  # fmt: skip
            windows += len(spans)
            host_lost = host_dup = 0
            for (_, end), (start, _) in itertools.pairwise(spans):
                if start < end - 0.01:
                    host_dup += 1
                elif start > end + 0.5 * INTERVAL_S:
                    if any(d0 - INTERVAL_S <= end and start <= d1 + 3 * INTERVAL_S
                           for d0, d1 in host.down):  # fmt: skip
                        explained += 1
                    else:
                        host_lost += round((start - end) / INTERVAL_S)
            lost += host_lost
            duplicated += host_dup
            response = self.api("GET", f"/devices/{host.device_id}/policy")
            if response.status_code == 404:
                # no policy ever reached it (the rollouts rolled back before its stage, or
                # were): it must be on the scheduler it started on, as nothing changed it
                policy: dict[str, Any] = {
                    "config": {"scheduler": BASELINE},
                    "applied": None,
                    "in_sync": True,
                }
            elif response.status_code == 200:
                policy = response.json()
            else:
                raise SystemExit(f"{host.name}'s policy not read: {response.text}")
            wanted = policy["config"]["scheduler"]
            per_host[host.name] = {
                "windows": len(spans),
                "lost": host_lost,
                "duplicated": host_dup,
                "policy": wanted,
                "device": host.scheduler(),
                "applied": (policy.get("applied") or {}).get("status"),
                "in_sync": policy["in_sync"],
                "journal_left": (host.state_dir / "journal.json").exists(),
                "spool_left": len(list((host.state_dir / "spool").glob("*.json"))),
            }
        applies_ok = all(
            h["policy"] == h["device"] and h["in_sync"] and not h["journal_left"]
            for h in per_host.values()
        )
        errors = self.server_errors()
        return {
            "seconds": round(wall),
            "windows_stored": windows,
            "windows_lost": lost,
            "windows_duplicated": duplicated,
            "gaps_explained_by_agent_kills": explained,
            "applies_finished_or_restored": applies_ok,
            "server_errors_outside_restarts": len(errors),
            "server_errors_sample": errors[:5],
            "events": self.events,
            "hosts": per_host,
        }

    def telemetry(self, device_id: str) -> list[dict[str, Any]]:
        """Every stored window of the device, newest first, a page of 10,000 at a time."""
        rows: list[dict[str, Any]] = []
        until = None
        while True:
            params: dict[str, Any] = {"limit": 10_000}
            if until is not None:
                params["until"] = until
            response = self.api("GET", f"/devices/{device_id}/telemetry", params=params)
            if response.status_code != 200:
                raise SystemExit(f"telemetry not read: {response.text}")
            page = [w for w in response.json() if w["window_start"] != until]
            rows += page
            if len(response.json()) < 10_000 or not page:
                return rows
            until = page[-1]["window_start"]

    def server_errors(self) -> list[str]:
        found = []
        for line in (self.data_dir / "serve.log").read_text().splitlines():
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            if entry.get("logger") != "blkpilot.access" or int(entry.get("status", 0)) < 500:
                continue
            when = datetime.fromisoformat(entry["time"]).timestamp()
            if not any(s - MARGIN_S <= when <= e + MARGIN_S for s, e, _ in self.outages):
                found.append(f"{entry['time']} {entry.get('message')}")
        return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=1200)
    parser.add_argument("--once", action="store_true", help="each kind of fault once")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    on_termination()  # a stopped run still stops its services and agents
    started = provenance("soak.py")
    base = Path(tempfile.mkdtemp(prefix="blkpilot-soak-"))
    soak = Soak(base, args.seconds)
    try:
        soak.set_up()
        result = soak.run(once=args.once)
    finally:
        soak.tear_down()
    result = {"benchmark": "soak", **result, **started}
    print(json.dumps(result, indent=2))
    ok = (
        result["windows_lost"] == 0
        and result["windows_duplicated"] == 0
        and result["applies_finished_or_restored"]
        and result["server_errors_outside_restarts"] == 0
    )
    if not args.no_record:
        record(
            "soak",
            result,
            {
                "seconds": "seconds",
                "windows stored": "windows_stored",
                "lost": "windows_lost",
                "duplicated": "windows_duplicated",
                "applies ok": "applies_finished_or_restored",
                "5xx outside restarts": "server_errors_outside_restarts",
            },
        )
    if ok:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"OFF TARGET; kept for a look: {base}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
