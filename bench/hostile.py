"""The hostile probe, replayed: a service and an agent of their own (real processes, an
embedded PostgreSQL, tmpfs loop devices this script makes and detaches), tried as a hostile
client and a failing operator would:

- hostile telemetry: counters past what a device does, non-finite and lax numbers, text that
  cannot be stored, impossible dates, oversized batches, a batch id reused with other
  content, bodies without a token, bodies that are not JSON;
- hostile policies: unknown schedulers and tunables, values out of range, unstorable text, in
  policies, rollouts and observations;
- the authorisation matrix: every principal (none, a garbage, revoked or expired token, viewer,
  operator, admin, the node, another node) against every kind of endpoint;
- outages: the service stopped and started, PostgreSQL restarted and killed with -9, while the
  agent sends telemetry and another client keeps sending batches;
- kills: SIGKILL between the journal and the sysfs write; SIGTERM, SIGINT, SIGHUP and SIGKILL
  in the middle of a canary;
- corrupt state files: the journal, the hold list, a canary marker, a spooled batch;
- node trouble (bench.hostile_node): overlapping windows, bytes that are not UTF-8, another
  charset, clients hanging up mid-body, a clock ahead, an unreadable node.json, a spool on a
  full disk, a killed canary's leftover candidate, two canaries from two state directories.

Recorded per part: tried, refused (a 4xx where a 4xx was right), 5xx, wrong (any other answer
where a refusal was right, or a refusal where the call was allowed), lost (telemetry windows
missing, or a device not back on its baseline). Exit status 1 when anything was 5xx, wrong or
lost.

    python -m bench.hostile              # the whole probe, recorded in bench/results/hostile.md
    python -m bench.hostile --quick --no-record   # the suite's short version
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx

from bench.record import ROOT, provenance, record
from bench.unwind import on_termination
from kernel.lab import devices as lab
from tests.proc import ServiceProcess, stop_embedded

BLKPILOT = str(Path(sys.executable).parent / "blkpilot")
API = "/api/v1"


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


@dataclass
class Tally:
    tried: int = 0
    refused: int = 0
    allowed: int = 0
    server_errors: int = 0
    wrong: int = 0
    lost: int = 0
    notes: list[str] = field(default_factory=list)

    def refusal(self, what: str, status: int) -> None:
        """A call that must be refused with a 4xx."""
        self.tried += 1
        if 400 <= status < 500:
            self.refused += 1
        elif status >= 500:
            self.server_errors += 1
            self.notes.append(f"{what}: {status}")
        else:
            self.wrong += 1
            self.notes.append(f"{what}: {status}, not a refusal")

    def check(self, what: str, ok: bool, *, lost: bool = False) -> None:
        """Something that must hold (a device restored, a command that keeps running)."""
        self.tried += 1
        if ok:
            self.allowed += 1
        elif lost:
            self.lost += 1
            self.notes.append(f"{what}: lost")
        else:
            self.wrong += 1
            self.notes.append(f"{what}: wrong")

    def cell(self) -> str:
        return (
            f"{self.tried} tried, {self.refused} refused, {self.server_errors} 5xx,"
            f" {self.wrong} wrong, {self.lost} lost"
        )

    @property
    def bad(self) -> int:
        return self.server_errors + self.wrong + self.lost


class Probe:
    def __init__(self, base: Path, quick: bool) -> None:
        self.base, self.quick = base, quick
        self.data_dir = base / "service"
        self.data_dir.mkdir(parents=True)
        self.service = ServiceProcess(
            self.data_dir, settings={"BLKPILOT_RATE_LIMIT": "100000/second"}
        )
        self.url = self.service.base_url
        self.agent: subprocess.Popen[bytes] | None = None
        self.devices: list[tuple[str, Path]] = []
        self.parts: dict[str, Tally] = {}
        self.admin = ""

    # --- processes ----------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        return self.service.env

    def start_service(self) -> None:
        self.service.start()

    def stop_service(self) -> None:
        if self.service.process is not None:
            self.service.stop()

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The CLI on this service: through its API with the admin token once there is one."""
        env = {**self.env, "BLKPILOT_URL": self.url}
        if self.admin:
            env["BLKPILOT_TOKEN"] = self.admin
        done = subprocess.run(
            [BLKPILOT, *args], env=env, capture_output=True, text=True, check=False
        )
        if check and done.returncode != 0:
            raise SystemExit(f"blkpilot {' '.join(args)}: {done.stderr}")
        return done

    def call(
        self, method: str, path: str, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.request(
            method, f"{self.url}{API}{path}", headers=headers, timeout=60, **kwargs
        )

    def device(self, size: int = 64 << 20) -> str:
        backing = lab.TMPFS / f"blkpilot-hostile-{uuid.uuid4().hex[:8]}.img"
        name = lab.attach(backing, size, direct_io=True)
        self.devices.append((name, backing))
        return name

    def pg_ctl(self, *args: str) -> None:
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", *args], pgdata=self.data_dir / "postgres", user="pgserver")

    # --- set-up -------------------------------------------------------------------------------

    def set_up(self) -> None:
        self.start_service()
        made = self.cli("token", "create", "--bootstrap", "--name", "hostile", "--role", "admin")
        self.admin = made.stdout.split()[-1]
        self.agent_device = self.device()
        self.state_dir = self.base / "agent"
        self.state_dir.mkdir()
        config = self.state_dir / "agent.toml"
        config.write_text(
            f'devices = ["{self.agent_device}"]\ninterval_s = 1.0\npush_interval_s = 1.0\n'
            "policy_interval_s = 2.0\ninventory_interval_s = 60.0\nmetrics_port = 0\n"
            "ebpf = false\n[power]\nrapl = false\nhwmon = false\nipmi = false\n"
        )
        enrollment = self.call("POST", "/enrollment-tokens", self.admin, json={}).json()["token"]
        self.cli(
            "agent",
            "enroll",
            "--server",
            self.url,
            "--token",
            enrollment,
            "--state-dir",
            str(self.state_dir),
            "--hostname",
            "hostile-a",
        )
        with (self.state_dir / "agent.log").open("ab") as out:
            self.agent = subprocess.Popen(
                [
                    BLKPILOT,
                    "agent",
                    "run",
                    "--state-dir",
                    str(self.state_dir),
                    "--config",
                    str(config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        node_state = json.loads((self.state_dir / "node.json").read_text())
        self.node_id, self.node_token = node_state["node_id"], node_state["node_token"]
        deadline = time.monotonic() + 60
        self.device_id = ""
        while not self.device_id and time.monotonic() < deadline:
            found = self.call("GET", f"/nodes/{self.node_id}/devices", self.admin).json()
            self.device_id = found[0]["id"] if found else ""
            time.sleep(0.5)
        if not self.device_id:
            raise SystemExit("the agent never reported its device")
        # another node, enrolled by hand: its own device, and a token of its own
        enrollment = self.call("POST", "/enrollment-tokens", self.admin, json={}).json()["token"]
        other = httpx.post(
            f"{self.url}{API}/nodes",
            json={"enrollment_token": enrollment, "hostname": "hostile-b"},
            timeout=30,
        ).json()
        self.other_id, self.other_token = other["node"]["id"], other["node_token"]
        inventory = {"devices": [{"name": "loop99", "holds_data": False}]}
        put = self.call(
            "PUT", f"/nodes/{self.other_id}/inventory", self.other_token, json=inventory
        )
        assert put.status_code == 200, put.text
        self.other_device = put.json()["devices"][0]["id"]

    def tear_down(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            self.agent.wait(timeout=60)
        with contextlib.suppress(Exception):
            self.stop_service()
        # the PostgreSQL the outages restarted by hand is not serve's to stop
        stop_embedded(self.data_dir)
        for name, backing in self.devices:
            lab.detach(name, backing)

    # --- the parts ----------------------------------------------------------------------------

    def window(
        self, device: str = "loop99", seconds_ago: int = 3600, **values: Any
    ) -> dict[str, Any]:
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=seconds_ago)
        window: dict[str, Any] = {
            "device": device,
            "start": start.isoformat(),
            "end": (start + timedelta(seconds=10)).isoformat(),
            "read_ios": 100,
            "write_ios": 10,
            "read_bytes": 409600,
            "write_bytes": 40960,
            "iops": 11.0,
            "read_share": 0.9,
            "mean_request_bytes": 4096.0,
            "mean_latency_us": 80.0,
            "queue_depth": 1.0,
            "utilisation": 0.1,
        }
        window.update(values)
        return window

    def batch(self, *windows: dict[str, Any], batch_id: str | None = None) -> dict[str, Any]:
        return {"batch_id": batch_id or str(uuid.uuid4()), "windows": list(windows)}

    def hostile_telemetry(self) -> Tally:
        tally = Tally()
        token = self.other_token

        def refused(what: str, body: Any = None, raw: bytes | None = None, **kw: Any) -> None:
            headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
            content = raw if raw is not None else json.dumps(body).encode()
            response = self.call(
                "POST",
                "/telemetry/batches",
                kw.pop("token", token),
                content=content,
                headers=headers,
            )
            tally.refusal(what, response.status_code)

        int64 = 2**63 - 1
        for what, values in [
            ("read_ios at INT64_MAX", {"read_ios": int64}),
            ("write_bytes at INT64_MAX", {"write_bytes": int64}),
            ("1e9 I/Os in 10 s", {"read_ios": 10**9}),
            ("2 TB in 10 s", {"read_bytes": 2 * 10**12}),
            ("iops 1e308", {"iops": 1e308}),
            ("negative count", {"read_ios": -1}),
            ("count as a string", {"read_ios": "123"}),
            ("count as a boolean", {"write_ios": True}),
            ("NUL in text", {"latency_note": "a\x00b"}),
            ("share above 1", {"read_share": 1.5}),
            ("power without a scope", {"power_watts": 10.0}),
            ("an unknown field", {"surprise": 1}),
            (
                "eBPF counts that disagree",
                {"read_ios": 5000, "latency_source": "ebpf", "operations": []},
            ),
        ]:
            refused(what, self.batch(self.window(**cast(dict[str, Any], values))))
        refused(
            "a lone surrogate",
            raw=json.dumps(self.batch(self.window()))
            .replace('"device": "loop99"', '"device": "loop99", "latency_note": "a\\ud800"')
            .encode(),
        )
        refused("NaN", raw=json.dumps(self.batch(self.window())).replace("80.0", "NaN").encode())
        for what, start in [
            ("a window in 9999", "9999-12-31T00:00:00+00:00"),
            ("a window in 1970", "1970-01-01T00:00:00+00:00"),
        ]:
            end = (datetime.fromisoformat(start) + timedelta(seconds=10)).isoformat()
            refused(what, self.batch(self.window(start=start, end=end)))
        future = datetime.now(UTC) + timedelta(hours=2)
        refused(
            "a window ahead of the clock",
            self.batch(
                self.window(
                    start=future.isoformat(), end=(future + timedelta(seconds=10)).isoformat()
                )
            ),
        )
        old = datetime.now(UTC) - timedelta(days=30)
        refused(
            "a window past retention",
            self.batch(
                self.window(start=old.isoformat(), end=(old + timedelta(seconds=10)).isoformat())
            ),
        )
        refused("end before start", self.batch(self.window(end="2000-01-01T00:00:00+00:00")))
        refused(
            "a two-hour window",
            self.batch(
                self.window(
                    seconds_ago=3 * 3600, end=(datetime.now(UTC) - timedelta(hours=1)).isoformat()
                )
            ),
        )
        refused("an unknown device", self.batch(self.window(device="loop1234")))
        refused(
            "5001 windows", self.batch(*[self.window(seconds_ago=10 * i + 20) for i in range(5001)])
        )
        refused("an empty batch", self.batch())
        refused("invalid JSON", raw=b'{"batch_id": ')
        refused("no token, invalid JSON", raw=b"{not json", token=None)
        refused("text/plain", self.batch(self.window()), headers={"Content-Type": "text/plain"})
        # the same id: same content is acknowledged, other content refused
        first = self.batch(self.window(seconds_ago=5000))
        stored = self.call("POST", "/telemetry/batches", token, json=first)
        tally.check("a batch stored", stored.status_code == 201)
        again = self.call("POST", "/telemetry/batches", token, json=first)
        tally.check("the same batch again acknowledged", again.status_code == 200)
        other = self.batch(self.window(seconds_ago=6000), batch_id=first["batch_id"])
        refused("a batch id reused with other content", other)
        refused("another node's batch id", other, token=self.node_token)
        # a 15 MB body without a token: refused before it is read
        big = b'{"batch_id": "' + b"x" * (15 << 20) + b'"}'
        started = time.monotonic()
        refused("15 MB without a token", raw=big, token=None)
        tally.notes.append(f"15 MB without a token answered in {time.monotonic() - started:.2f} s")
        maintained = self.cli("telemetry", "maintain", check=False)
        tally.check("the upkeep passes after all of it", maintained.returncode == 0)
        return tally

    def hostile_policies(self) -> Tally:
        tally = Tally()
        device = self.device_id
        before = self.call("GET", f"/devices/{device}/policy", self.admin)
        for what, body in [
            ("an unknown scheduler", {"config": {"scheduler": "cfq"}, "reason": "probe"}),
            (
                "another scheduler's tunable",
                {
                    "config": {"scheduler": "bfq", "scheduler_tunables": {"fifo_batch": 1}},
                    "reason": "probe",
                },
            ),
            (
                "a tunable out of range",
                {
                    "config": {"scheduler": "bfq", "scheduler_tunables": {"slice_idle_us": -5}},
                    "reason": "probe",
                },
            ),
            ("nr_requests 0", {"config": {"nr_requests": 0}, "reason": "probe"}),
            ("nr_requests 2^40", {"config": {"nr_requests": 2**40}, "reason": "probe"}),
            ("read_ahead_kb as text", {"config": {"read_ahead_kb": "1024"}, "reason": "probe"}),
            (
                "a lone surrogate in the reason",
                {"config": {"scheduler": "none"}, "reason": "a\ud800b"},
            ),
            ("a 1 MB reason", {"config": {"scheduler": "none"}, "reason": "x" * (1 << 20)}),
            ("an unknown field", {"config": {"scheduler": "none"}, "reason": "probe", "x": 1}),
            ("no reason", {"config": {"scheduler": "none"}}),
        ]:
            response = self.call(
                "PUT",
                f"/devices/{device}/policy",
                self.admin,
                content=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            tally.refusal(f"policy: {what}", response.status_code)
        after = self.call("GET", f"/devices/{device}/policy", self.admin)
        tally.check(
            "the policy unchanged",
            (before.status_code, before.text) == (after.status_code, after.text),
        )
        rollout = {
            "name": "probe",
            "config": {"scheduler": "none"},
            "reason": "probe",
            "target": {"node_labels": {"rack": "a"}},
        }
        for what, change in [
            ("a lone surrogate in a label", {"target": {"node_labels": {"rack": "a\udfff"}}}),
            ("no target", {"target": {}}),
            ("a stage of 0", {"stages": ["0"]}),
            ("stages that never reach every node", {"stages": ["1"]}),
            ("a canary of 1000 rounds", {"canary": {"rounds": 1000}}),
            ("an unknown scheduler", {"config": {"scheduler": "noop"}}),
        ]:
            response = self.call(
                "POST",
                "/rollouts",
                self.admin,
                content=json.dumps({**rollout, **cast(dict[str, Any], change)}).encode(),
                headers={"Content-Type": "application/json"},
            )
            tally.refusal(f"rollout: {what}", response.status_code)
        observation = {
            "device_id": self.other_device,
            "kind": "benchmark",
            "tool": "fio",
            "workload": {"name": "probe", "jobs": [{"name": "r"}]},
            "configuration": {"scheduler": "none"},
            "metrics": {"iops": 1.0},
            "started_at": "2026-11-01T12:00:00+00:00",
            "finished_at": "2026-11-01T12:00:30+00:00",
        }
        for what, change in [
            (
                "dated 9999",
                {
                    "started_at": "9999-01-01T00:00:00+00:00",
                    "finished_at": "9999-01-01T00:01:00+00:00",
                },
            ),
            (
                "dated 1970",
                {
                    "started_at": "1970-01-01T00:00:00+00:00",
                    "finished_at": "1970-01-01T00:01:00+00:00",
                },
            ),
            ("a NaN metric", {"metrics": {"iops": "NaN"}}),
            ("a canary without a verdict", {"kind": "canary"}),
        ]:
            body = json.dumps({**observation, **cast(dict[str, Any], change)}).replace(
                '"NaN"', "NaN"
            )
            response = self.call(
                "POST",
                "/observations",
                self.other_token,
                content=body.encode(),
                headers={"Content-Type": "application/json"},
            )
            tally.refusal(f"observation: {what}", response.status_code)
        return tally

    def authorisation(self) -> Tally:
        tally = Tally()
        revoked = self.cli("token", "create", "--name", "probe-revoked", "--role", "operator")
        self.cli("token", "revoke", "probe-revoked")
        expired = self.cli(
            "token",
            "create",
            "--name",
            "probe-expired",
            "--role",
            "operator",
            "--ttl-hours",
            "0.0003",
        ).stdout.split()[-1]
        principals = {
            "none": None,
            "garbage": "bpo_" + "x" * 43,
            "revoked": revoked.stdout.split()[-1],
            "expired": expired,
            "viewer": self.cli("token", "create", "--name", "probe-viewer").stdout.split()[-1],
            "operator": self.cli(
                "token", "create", "--name", "probe-operator", "--role", "operator"
            ).stdout.split()[-1],
            "admin": self.admin,
            "node": self.node_token,
            "other node": self.other_token,
        }
        time.sleep(1.5)  # the expired token's second has passed
        viewers = {"viewer", "operator", "admin"}
        operators = {"operator", "admin"}
        nobody = str(uuid.uuid4())
        node, device = self.node_id, self.device_id
        # (method, path, who may) — a body of {} where one is needed: the allowed get a 4xx
        # of validation (or 404), never 401/403; the others 401/403, never anything else
        matrix: list[tuple[str, str, set[str]]] = [
            ("GET", "/nodes", viewers),
            ("GET", "/devices", viewers),
            ("GET", "/audit", viewers),
            ("GET", "/api-tokens", {"admin"}),
            ("POST", "/api-tokens", {"admin"}),
            ("POST", "/enrollment-tokens", {"admin"}),
            ("POST", f"/nodes/{node}/revoke", {"admin"}),
            ("PUT", f"/devices/{device}/policy", operators),
            ("POST", "/rollouts", operators),
            ("POST", f"/rollouts/{nobody}/pause", operators),
            ("POST", f"/recommendations/{nobody}/accept", operators),
            ("POST", "/telemetry/batches", {"node", "other node"}),
            ("POST", f"/nodes/{node}/heartbeat", {"node"}),
            ("PUT", f"/nodes/{node}/inventory", {"node"}),
            ("POST", f"/devices/{device}/applied-state", {"node"}),
            ("GET", f"/devices/{device}/telemetry", {*viewers, "node"}),
            ("GET", f"/nodes/{node}/policies", {*viewers, "node"}),
        ]
        for method, path, allowed in matrix:
            for who, token in principals.items():
                body = {"content": b"{}", "headers": {"Content-Type": "application/json"}}
                response = self.call(method, path, token, **(body if method != "GET" else {}))
                what = f"{who} {method} {path}"
                if who in allowed:
                    tally.tried += 1
                    if response.status_code >= 500:
                        tally.server_errors += 1
                        tally.notes.append(f"{what}: {response.status_code}")
                    elif response.status_code in (401, 403):
                        tally.wrong += 1
                        tally.notes.append(f"{what}: refused {response.status_code}")
                    else:
                        tally.allowed += 1
                elif response.status_code in (401, 403, 404):
                    tally.tried += 1
                    tally.refused += 1
                else:
                    tally.refusal(what, 200 if response.status_code < 400 else response.status_code)
        return tally

    def outages(self) -> Tally:
        tally = Tally()
        statuses: dict[int, int] = {}
        stop = threading.Event()
        sent: list[dict[str, Any]] = []

        def hammer() -> None:
            """Small batches from the other node every 0.1 s, each retried until stored."""
            index = 0
            origin = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
            while not stop.is_set():
                index += 1
                start = origin + timedelta(seconds=10 * index)  # a device's windows: no overlap
                end = start + timedelta(seconds=10)
                body = self.batch(self.window(start=start.isoformat(), end=end.isoformat()))
                while not stop.is_set():
                    try:
                        code = self.call(
                            "POST", "/telemetry/batches", self.other_token, json=body
                        ).status_code
                    except httpx.TransportError:
                        code = 0
                    statuses[code] = statuses.get(code, 0) + 1
                    if code in (200, 201):
                        sent.append(body)
                        break
                    time.sleep(0.5)
                time.sleep(0.1)

        already = len(self._stored(self.other_device))
        thread = threading.Thread(target=hammer, daemon=True)
        thread.start()
        started = datetime.now(UTC)
        faults: list[tuple[str, Callable[[], None]]] = [
            ("service stopped", self._service_outage),
            ("PostgreSQL restarted", lambda: self.pg_ctl("-m", "fast", "restart")),
            ("PostgreSQL killed with -9", self._kill_postgres),
        ]
        for name, fault in faults:
            time.sleep(3)
            log(f"outage: {name}")
            fault()
        time.sleep(8)  # the agent's spool drains
        stop.set()
        thread.join(timeout=120)
        tally.tried += sum(statuses.values())
        tally.server_errors += sum(n for code, n in statuses.items() if code >= 500 and code != 503)
        tally.notes.append(f"batch answers during outages: {dict(sorted(statuses.items()))}")
        # every batch the hammer saw stored is there once; the agent's windows have no gap
        stored = len(self._stored(self.other_device)) - already
        tally.check(f"{len(sent)} batches stored once", stored == len(sent), lost=True)
        windows = self.call(
            "GET",
            f"/devices/{self.device_id}/telemetry",
            self.admin,
            params={"limit": 10000, "since": started.isoformat()},
        ).json()
        windows.sort(key=lambda w: w["window_start"])
        gaps = sum(a["window_end"] != b["window_start"] for a, b in itertools.pairwise(windows))
        tally.lost += gaps
        tally.tried += len(windows)
        tally.notes.append(f"the agent's {len(windows)} windows since the first fault: {gaps} gaps")
        return tally

    def _stored(self, device: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.call(
            "GET", f"/devices/{device}/telemetry", self.admin, params={"limit": 10000}
        ).json()
        return found

    def _service_outage(self) -> None:
        self.stop_service()
        time.sleep(3 if self.quick else 10)
        self.start_service()

    def _kill_postgres(self) -> None:
        pid = int((self.data_dir / "postgres" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        time.sleep(3)
        with contextlib.suppress(Exception):  # its children go with it; a stale pid file stays
            (self.data_dir / "postgres" / "postmaster.pid").unlink()
        self.pg_ctl("start", "-o", "-h '' -k " + str(self.data_dir / "postgres"))

    def kills(self) -> Tally:
        tally = Tally()
        device = self.device()
        scheduler = Path(f"/sys/block/{device}/queue/scheduler")
        state = self.base / "kills"
        repeats = 2 if self.quick else 10
        script = textwrap.dedent(
            f"""
            import os, signal, sys
            sys.path.insert(0, {str(ROOT)!r})
            from pathlib import Path
            from agent.applier import Applier
            from agent.effects import Effects
            from agent.host import HostPaths
            from agent.contract.tunables import DeviceConfig, Scheduler

            class DiesAfterFirstWrite(Effects):
                def write_attribute(self, path, value):
                    super().write_attribute(path, value)
                    os.kill(os.getpid(), signal.SIGKILL)

            Applier(HostPaths(), Path({str(state)!r}), DiesAfterFirstWrite()).apply(
                {device!r}, DeviceConfig(scheduler=Scheduler.BFQ, read_ahead_kb=1024)
            )
            """
        )
        from agent.applier import Applier
        from agent.host import HostPaths

        for _ in range(repeats):
            subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
            Applier(HostPaths(), state).recover()
            tally.check("kill -9 mid-apply restored", "[none]" in scheduler.read_text(), lost=True)
        argv = [
            BLKPILOT,
            "agent",
            "canary",
            device,
            "--mode",
            "synthetic",
            "--scheduler",
            "bfq",
            "--rounds",
            "20",
            "--round-seconds",
            "0.5",
            "--no-report",
            "--state-dir",
            str(state),
        ]
        for sig in [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL] * (
            1 if self.quick else 3
        ):
            canary = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 120
            while "[bfq]" not in scheduler.read_text() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            canary.send_signal(sig)
            code = canary.wait(timeout=120)
            if sig == signal.SIGKILL:
                Applier(HostPaths(), state).recover()  # the agent's next start
                expected = -9
            else:
                expected = 128 + sig
            restored = "[none]" in scheduler.read_text()
            tally.check(f"{sig.name} mid-canary exits {expected}", code == expected)
            tally.check(f"{sig.name} mid-canary restored", restored, lost=True)
        return tally

    def corrupt_state(self) -> Tally:
        tally = Tally()
        device = self.device()
        for what, files in [
            ("a truncated journal", {"journal.json": '{"txid": "ab", "device": "'}),
            ("a hold list that is not JSON", {"held.json": "{held"}),
            ("both", {"journal.json": "[", "held.json": "\xff\xfe"}),
            ("a canary marker that is not JSON", {"canaries/x.json": "{"}),
            ("a spooled batch that is not a batch", {"spool/0001.json": '{"batch_id": 1}'}),
        ]:
            state = self.base / f"corrupt-{uuid.uuid4().hex[:6]}"
            state.mkdir()
            for name, content in files.items():
                (state / name).parent.mkdir(parents=True, exist_ok=True)
                (state / name).write_bytes(content.encode("utf-8", "surrogateescape"))
            status = self.cli("agent", "status", "--state-dir", str(state), check=False)
            tally.check(
                f"{what}: agent status", status.returncode == 0 and "Traceback" not in status.stderr
            )
            apply = self.cli(
                "agent",
                "apply",
                device,
                "--state-dir",
                str(state),
                "--scheduler",
                "bfq",
                check=False,
            )
            tally.check(
                f"{what}: agent apply",
                apply.returncode in (0, 1) and "Traceback" not in apply.stderr,
            )
            if apply.returncode == 0:
                self.cli("agent", "rollback", device, "--state-dir", str(state), check=False)
            config = state / "agent.toml"
            config.write_text(f'devices = ["{device}"]\nmetrics_port = 0\nebpf = false\n')
            run = subprocess.Popen(
                [
                    BLKPILOT,
                    "agent",
                    "run",
                    "--offline",
                    "--state-dir",
                    str(state),
                    "--config",
                    str(config),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=self.env,
            )
            time.sleep(2 if self.quick else 4)
            alive = run.poll() is None
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=60)
            tally.check(f"{what}: agent run keeps running", alive)
            tally.check(
                f"{what}: {device} as it was",
                "[none]" in Path(f"/sys/block/{device}/queue/scheduler").read_text(),
            )
        return tally

    def node_trouble(self) -> Tally:
        from bench.hostile_node import node_trouble

        tally = Tally()
        node_trouble(self, tally)
        return tally

    def run(self, only: list[str] | None = None) -> None:
        for name, part in [
            ("telemetry", self.hostile_telemetry),
            ("policies", self.hostile_policies),
            ("authorisation", self.authorisation),
            ("outages", self.outages),
            ("kills", self.kills),
            ("state files", self.corrupt_state),
            ("node trouble", self.node_trouble),
        ]:
            if only and name not in only:
                continue
            log(f"{name} …")
            self.parts[name] = part()
            log(f"{name}: {self.parts[name].cell()}")
            for note in self.parts[name].notes[:20]:
                log(f"    {note}")


@contextlib.contextmanager
def probe(quick: bool) -> Iterator[Probe]:
    base = Path(tempfile.mkdtemp(prefix="blkpilot-hostile-"))
    found = Probe(base, quick)
    try:
        found.set_up()
        yield found
    finally:
        found.tear_down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (the suite's)")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument(
        "--part",
        action="append",
        help="only this part (repeatable): telemetry, policies, authorisation, outages, kills,"
        " 'state files', 'node trouble'; a run of some parts is never recorded",
    )
    args = parser.parse_args()
    on_termination()  # a stopped run still removes what it started
    with probe(args.quick) as found:
        found.run(args.part)
    parts = found.parts
    bad = sum(t.bad for t in parts.values())
    result: dict[str, Any] = {
        **provenance(__file__),
        **{name: tally.cell() for name, tally in parts.items()},
        "notes": {name: tally.notes for name, tally in parts.items()},
        "tried": sum(t.tried for t in parts.values()),
        "bad": bad,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "notes"}, indent=2))
    if not args.no_record and not args.part:
        record("hostile", result, {name: name for name in parts} | {"5xx+wrong+lost": "bad"})
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
