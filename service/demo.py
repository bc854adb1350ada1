"""`blkpilot demo`: the service on the embedded database, three lab loop devices — two empty
scratch devices, and one that holds data as a user's would (ext4 with files, a steady fio
workload reading it) — and the local node enrolled with its agent running on them: telemetry
with eBPF latency distributions, benchmarks and the nightly job on the scratch devices, a live
canary on the data device. Each step uses the same public API an operator or agent would.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import uvicorn

from agent.client import ServiceClient
from agent.contract import __version__
from agent.contract.logs import dressed
from agent.contract.wire import Heartbeat
from agent.enrollment import enroll_node
from agent.errors import AgentError, NotEnrolled, ServiceRejected
from agent.state import NodeState
from kernel.lab.devices import (
    TMPFS,
    DataDevice,
    data_device,
    lab_devices,
    start_workload,
    stop_workload,
)
from service.app import create_app
from service.db import Database
from service.rollouts.worker import RolloutWorker
from service.runtime import exit_cleanly_on_signals, open_database
from service.security import Role
from service.settings import Settings
from service.tokens import repository as token_repository
from service.tokens import service as token_service

DEMO_TOKEN_PREFIX = "demo-admin-"


def _fresh_admin_token(database: Database, data_dir: Path) -> tuple[str, Path]:
    """Revoke the previous demo's admin token, make a new one, keep it in a 0600 file."""
    with database.sessionmaker.begin() as session:
        # Demo bookkeeping, not an operator action: done here rather than through the API.
        token_repository.revoke_by_prefix(session, DEMO_TOKEN_PREFIX, datetime.now(UTC))
        name = f"{DEMO_TOKEN_PREFIX}{int(time.time())}"
        while token_repository.api_token_name_taken(session, name):
            name += "x"
        _, secret = token_service.create_api_token(session, "demo", name=name, role=Role.ADMIN)
    path = data_dir / "admin.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    return secret, path


def _enroll_local_node(base_url: str, admin_token: str, state_dir: Path) -> tuple[NodeState, bool]:
    """Reuse the node this machine enrolled before if the service still knows it."""
    try:
        state = NodeState.load(state_dir)
        if state.server_url == base_url:
            with ServiceClient(base_url, state.node_token) as client:
                client.heartbeat(
                    state.node_id,
                    Heartbeat(agent_version=__version__, kernel_version=platform.release()),
                )
            return state, False
    except NotEnrolled:
        pass
    except ServiceRejected as error:
        if error.status != 401:
            raise
    response = httpx.post(
        f"{base_url}/api/v1/enrollment-tokens",
        json={"labels": {"demo": "true"}, "ttl_hours": 1},
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=10,
    )
    response.raise_for_status()
    state = enroll_node(
        base_url,
        response.json()["token"],
        state_dir,
        hostname=socket.gethostname(),
        labels={"role": "lab"},
    )
    return state, True


def _start_agent(
    state_dir: Path, devices: list[str], *, interval: float, metrics_port: int, log: Path
) -> subprocess.Popen[bytes]:
    """The local agent as its own process, as on any node of a fleet."""
    with log.open("ab") as output:
        return subprocess.Popen(
            [
                str(Path(sys.executable).parent / "blkpilot"),
                "agent",
                "run",
                "--state-dir",
                str(state_dir),
                "--interval",
                str(interval),
                "--push-interval",
                str(interval * 2),
                "--policy-interval",
                str(interval * 2),
                "--metrics-port",
                str(metrics_port),
                *[arg for device in devices for arg in ("--device", device)],
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


DEMO_WORKLOADS = (
    "hs23-single-randread-4k-qd1",
    "hs23-single-randread-4k-qd16",
    "hs23-single-randwrite-4k-qd1",
    "hs23-single-randrw50-4k-qd1",
)
DEMO_SCHEDULERS = ("none", "mq-deadline", "kyber", "bfq")
START_ON = {"disk": "bfq"}  # lab device -> the scheduler it starts on (the others: the kernel's)
LIVE_CANDIDATE = "mq-deadline"  # what the live canary tries on the data device
DATA_WORKLOAD_IOPS = 3000  # the data device's steady traffic: 4 KiB reads of a file in it


# A step that has not ended in this long is stopped (SIGTERM: a canary restores its baseline
# first) and counts as failed with STEP_TIMED_OUT, as timeout(1) says it: a demo that never
# reaches its recommendations shows nothing. The nightly job on Ray is the step that can hang —
# a local Ray whose node stops answering on a loaded host — and it is run in-process after.
STEP_BUDGET_S = {"nightly": 300.0}
STEP_DEFAULT_BUDGET_S = 900.0
STEP_TIMED_OUT = 124


def _step(command: list[str], log: Path, running: list[subprocess.Popen[bytes]]) -> int:
    """One step of the demo, its output appended to the log; its exit status, or
    STEP_TIMED_OUT once the step's budget has passed."""
    budget = STEP_BUDGET_S.get(command[1], STEP_DEFAULT_BUDGET_S)
    with log.open("ab") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        running.append(process)
        try:
            code = process.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            output.write(f"blkpilot demo: stopped after {budget:.0f} s\n".encode())
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            code = STEP_TIMED_OUT
        finally:
            running.remove(process)
    return code


def _what(command: list[str]) -> str:
    """A demo step's command, as the line that says what the demo is doing."""
    words = command[1:]
    if words[:2] == ["bench", "sweep"]:
        device = words[words.index("--device") + 1]
        return (
            f"benchmarking {device}: {words.count('--scheduler')} schedulers x"
            f" {words.count('--workload')} workloads"
        )
    if words[:1] == ["nightly"]:
        return "the nightly job: training and recommending" + (
            " in this process" if "--local" in words else ""
        )
    if words[:2] == ["agent", "canaries"]:
        return "the canaries the nightly job scheduled"
    if words[:2] == ["agent", "canary"]:
        return (
            f"a live canary of {words[words.index('--scheduler') + 1]} on {words[2]}'s own traffic"
        )
    return " ".join(words[:2])


def _await_inventory(
    base_url: str, admin_token: str, state_dir: Path, names: set[str], server: uvicorn.Server
) -> None:
    """Until the service knows the lab devices (the agent's first inventory): the benchmarks
    send their results for devices the service knows. (What a device runs after a benchmark
    changed it back and forth is the agent's to report: it does at its next policy check.)"""
    node_id = NodeState.load(state_dir).node_id
    headers = {"Authorization": f"Bearer {admin_token}"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not server.should_exit:
        response = httpx.get(
            f"{base_url}/api/v1/nodes/{node_id}/devices", headers=headers, timeout=10
        )
        response.raise_for_status()
        if names <= {device["name"] for device in response.json()}:
            return
        time.sleep(0.2)
    raise httpx.HTTPError(f"the local agent did not report {sorted(names)} within 60 s")


@dataclass
class Tuning:
    """Where the demo's first tuning is, for the terminal and the dashboard: step `step` of
    `steps` (what it does), and about how long the rest takes — the steps left at the mean
    of those done (the host's own pace, busy or not); None until one step is done."""

    steps: int = 0
    step: int = 0
    what: str = ""
    started: float = field(default_factory=time.monotonic)
    done: bool = False

    def left_s(self) -> float | None:
        finished = self.step - 1
        if finished < 1 or self.done:
            return None
        return (time.monotonic() - self.started) / finished * (self.steps - finished)

    def said(self) -> str:
        """ "tuning: step 3 of 5 (the nightly job: training and recommending), about 2
        minutes left" — the dashboard's line while no recommendation is open yet."""
        left = self.left_s()
        eta = (
            ""
            if left is None
            else f", about {max(1, round(left / 60))} minute{'s' if left >= 90 else ''} left"
        )
        return f"tuning: step {self.step} of {self.steps} ({self.what}){eta}"


def _tune(
    base_url: str,
    admin_token: str,
    state_dir: Path,
    devices: dict[str, str],
    seconds: float,
    log: Path,
    running: list[subprocess.Popen[bytes]],
    server: uvicorn.Server,
    data: str | None = None,
    tuning: Tuning | None = None,
) -> None:
    """The loop's first turn on the lab devices: every stock scheduler benchmarked on a few
    workloads (results reported as observations), then the nightly job (local Ray) trains and
    recommends. The dashboard shows both."""
    blkpilot_cli = str(Path(sys.executable).parent / "blkpilot")
    known = set(devices.values()) | ({data} if data else set())
    _await_inventory(base_url, admin_token, state_dir, known, server)
    steps = _demo_steps(blkpilot_cli, state_dir, devices, seconds, data)
    print(
        f"blkpilot demo: benchmarking {len(DEMO_SCHEDULERS)} schedulers x"
        f" {len(DEMO_WORKLOADS)} workloads on the lab devices, then the nightly job and its"
        f" canaries (log {log})",
        flush=True,
    )
    tuning = tuning or Tuning()
    tuning.steps, tuning.started = len(steps), time.monotonic()
    for number, command in enumerate(steps, start=1):
        began = time.monotonic()
        tuning.step, tuning.what = number, _what(command)
        left = tuning.left_s()
        eta = "" if left is None else f" (about {left / 60:.0f} min left)"
        print(f"blkpilot demo: [{number}/{len(steps)}] {_what(command)} …{eta}", flush=True)
        code = _step(command, log, running)
        print(
            f"blkpilot demo: [{number}/{len(steps)}] done in {time.monotonic() - began:.0f} s"
            + (f" (exit status {code})" if code else ""),
            flush=True,
        )
        if server.should_exit:
            return
        if code != 0 and command[1] == "nightly":
            # Ray's start times out on a loaded host (its agents take longer than it waits):
            # the same job in this process still reaches the recommendations
            print(
                f"blkpilot demo: the nightly job could not run on a local Ray ({code}; see"
                f" {log}); running it in-process (blkpilot nightly --local)",
                flush=True,
            )
            command = [*command, "--local"]
            code = _step(command, log, running)
            if server.should_exit:
                return
        # a canary's verdict is its exit status: 1 fail, 3 inconclusive
        if code != 0 and not (command[1:3] == ["agent", "canary"] and code in (1, 3)):
            print(f"blkpilot demo: {' '.join(command[1:3])} failed ({code}); see {log}", flush=True)
            return
    tuning.done = True
    headers = {"Authorization": f"Bearer {admin_token}"}
    proposed = httpx.get(
        f"{base_url}/api/v1/recommendations",
        params={"status": "proposed"},
        headers=headers,
        timeout=30,
    )
    proposed.raise_for_status()
    print(
        f"blkpilot demo: {len(proposed.json())} recommendation(s) on the dashboard: {base_url}/ui/",
        flush=True,
    )
    print("blkpilot demo recommendations ready", flush=True)


def _demo_steps(
    blkpilot_cli: str, state_dir: Path, devices: dict[str, str], seconds: float, data: str | None
) -> list[list[str]]:
    """The demo's tuning, as the commands an operator would run: a benchmark sweep of each
    lab device, the nightly job, the canaries it scheduled, and a live canary on the device
    that holds data."""
    steps = [
        [
            blkpilot_cli,
            "bench",
            "sweep",
            "--state-dir",
            str(state_dir),
            "--device",
            device,
            "--duration",
            str(seconds),
            *[a for w in DEMO_WORKLOADS for a in ("--workload", w)],
            *[a for s in DEMO_SCHEDULERS for a in ("--scheduler", s)],
        ]
        for _, device in sorted(devices.items())
    ]
    steps.append([blkpilot_cli, "nightly", "--max-canaries", "2"])
    # the canaries the nightly job scheduled, run as any node runs them
    steps.append(
        [
            blkpilot_cli,
            "agent",
            "canaries",
            "--state-dir",
            str(state_dir),
            "--run",
            "--limit",
            "2",
            "--rounds",
            "3",
            "--round-seconds",
            str(seconds),
        ]
    )
    if data is not None:
        # the device that holds data: no benchmark may write to it; its own traffic judges
        # a candidate (the agent picks the live canary for a device that holds data)
        steps.append(
            [
                blkpilot_cli,
                "agent",
                "canary",
                data,
                "--state-dir",
                str(state_dir),
                "--scheduler",
                LIVE_CANDIDATE,
                "--pairs",
                "16",
                # a verdict (or "inconclusive") within a few minutes, however busy the host
                "--max-seconds",
                "180",
            ]
        )
    return steps


def _rollout_worker(
    settings: Settings, database: Database, node: NodeState, state_dir: Path
) -> RolloutWorker:
    """The rollout worker, pointed at this machine as the local node: an accepted
    recommendation is tried under a canary here by the same playbooks a fleet runs
    (ansible's local connection, the CLI of this installation, the demo agent's state)."""
    host_vars = settings.data_dir / "rollout-hosts.json"
    cli = Path(sys.executable).parent / "blkpilot"
    variables = {
        node.hostname: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "blkpilot_cli": str(cli),
            "blkpilot_state_dir": str(state_dir),
        }
    }
    host_vars.write_text(json.dumps(variables, indent=2) + "\n")
    worker = RolloutWorker(settings.model_copy(update={"rollout_host_vars": host_vars}), database)
    worker.start()
    return worker


def _access_log_to_file(path: Path) -> None:
    """The service's access log (a JSON line per request) to a file, with its time, request
    id, route, status and duration as the service writes it: on the terminal it buried the
    banner that says where everything is."""
    access = logging.getLogger("blkpilot.access")
    access.addHandler(dressed(logging.FileHandler(path)))
    access.propagate = False


def _lab(data_dir: Path, port: int) -> dict[str, tuple[Path, int]]:
    """The two scratch devices: loop devices on files, one in memory, one on disk."""
    return {
        # memory speed: the closest this machine has to an ultra-low-latency device
        "tmpfs": (TMPFS / f"blkpilot-demo-{port}.img", 256 << 20),
        # the machine's disk through the loop driver, SSD-like
        "disk": (data_dir / "lab" / "disk.img", 512 << 20),
    }


def _start_as_udev_would(devices: dict[str, str]) -> None:
    """The disk-backed device starts where a common udev rule puts a rotational device: on
    bfq, set as udev would set it (not by blkpilot, which has nothing to undo). Whether that
    is right here is for the measurements and the nightly job to say."""
    for kind, scheduler in START_ON.items():
        (Path("/sys/block") / devices[kind] / "queue" / "scheduler").write_text(scheduler)


def run_demo(
    settings: Settings,
    *,
    port: int | None,
    agent_state_dir: Path | None,
    agent_interval: float = 2.0,
    agent_metrics_port: int = 9477,
    tune_seconds: float = 0.5,
) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not every request the demo makes
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    _access_log_to_file(settings.data_dir / "access.log")
    port = port or settings.port
    host = settings.host
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104
    base_url = f"http://{shown_host}:{port}"
    state_dir = agent_state_dir or settings.data_dir / "agent"
    settings.data_dir.mkdir(parents=True, exist_ok=True)

    lab = _lab(settings.data_dir, port)
    agents: list[subprocess.Popen[bytes]] = []
    workers: list[RolloutWorker] = []
    with (
        exit_cleanly_on_signals(),
        lab_devices(lab) as devices,
        data_device(
            settings.data_dir / "lab" / "data.img", 512 << 20, settings.data_dir / "lab" / "mnt"
        ) as holding,
        open_database(settings) as database,
    ):
        traffic = start_workload(
            holding.data_file, iodepth=1, engine="psync", rate_iops=DATA_WORKLOAD_IOPS
        )
        _start_as_udev_would(devices)
        admin_token, token_path = _fresh_admin_token(database, settings.data_dir)
        app = create_app(settings, database)
        tuning = Tuning()
        app.state.tuning = tuning  # the dashboard says where it is
        server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        )
        failure: list[BaseException] = []

        def after_start() -> None:
            while not server.started:
                if server.should_exit:
                    return
                time.sleep(0.05)
            try:
                state, new = _enroll_local_node(base_url, admin_token, state_dir)
            except (AgentError, httpx.HTTPError) as error:
                failure.append(error)
                server.should_exit = True
                return
            agents.append(
                _start_agent(
                    state_dir,
                    sorted([*devices.values(), holding.name]),
                    interval=agent_interval,
                    metrics_port=agent_metrics_port,
                    log=settings.data_dir / "agent.log",
                )
            )
            workers.append(_rollout_worker(settings, database, state, state_dir))
            print(
                _banner(
                    settings,
                    base_url,
                    token_path,
                    f"{state.hostname} {'enrolled' if new else 'already enrolled'} as"
                    f" {state.node_id}",
                    devices,
                    holding,
                    agent_interval,
                    agent_metrics_port,
                ),
                flush=True,
            )

        def after_start_then_tune() -> None:
            after_start()
            if failure or server.should_exit or tune_seconds <= 0:
                return
            try:
                _tune(
                    base_url,
                    admin_token,
                    state_dir,
                    devices,
                    tune_seconds,
                    settings.data_dir / "tuning.log",
                    agents,
                    server,
                    data=holding.name,
                    tuning=tuning,
                )
            except (OSError, httpx.HTTPError) as error:
                print(f"blkpilot demo: tuning failed ({error}); see the tuning log", flush=True)
            finally:
                tuning.done = True

        threading.Thread(target=after_start_then_tune, name="demo-enroll", daemon=True).start()
        try:
            server.run()
        finally:
            for worker in workers:
                worker.stop()
            for process in agents:
                _stop(process)
            stop_workload(traffic)
        if failure:
            raise SystemExit(f"demo failed to enroll the local node: {failure[0]}")


def _banner(
    settings: Settings,
    base_url: str,
    token_path: Path,
    node: str,
    devices: dict[str, str],
    holding: DataDevice,
    agent_interval: float,
    agent_metrics_port: int,
) -> str:
    """What the demo prints once it runs: where everything is."""
    lab_line = ", ".join(f"{name} ({kind})" for kind, name in sorted(devices.items()))
    return "\n".join(
        [
            "",
            "blkpilot demo is running",
            f"  API            {base_url}/api/v1",
            f"  API docs       {base_url}/docs   (OpenAPI: {base_url}/openapi.json)",
            f"  health         {base_url}/healthz  {base_url}/readyz",
            f"  metrics        {base_url}/metrics",
            f"  dashboard      {base_url}/ui/   (sign in with the admin token)",
            f"  admin token    {token_path}",
            f"  local node     {node}",
            f"  lab devices    {lab_line}: loop devices on empty files;"
            f" {devices['disk']} starts on {START_ON['disk']} (a common udev rule's"
            " choice for rotational devices)",
            f"  data device    {holding.name}: ext4 with files at {holding.mountpoint},"
            f" fio reading {DATA_WORKLOAD_IOPS} 4 KiB blocks/s of it; a live canary"
            f" tries {LIVE_CANDIDATE} on its own traffic",
            f"  local agent    every {agent_interval:g} s; metrics on"
            f" http://127.0.0.1:{agent_metrics_port}/metrics;"
            f" log {settings.data_dir / 'agent.log'}",
            f"  access log     {settings.data_dir / 'access.log'}",
            f"  service log    {settings.data_dir / 'service.log'}",
            f"  database       embedded PostgreSQL in {settings.data_dir / 'postgres'}"
            if settings.database_url is None
            else "  database       BLKPILOT_DATABASE_URL",
            "Press Ctrl-C to stop: the agent stops, the lab devices are detached,"
            " the embedded database stops.",
            "blkpilot demo ready",
        ]
    )
