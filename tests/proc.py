"""Helpers for tests that run blkpilot as a real process on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

BLKPILOT = str(Path(sys.executable).parent / "blkpilot")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh machine: embedded database in data_dir, nothing inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLKPILOT_")}
    env["BLKPILOT_DATA_DIR"] = str(data_dir)
    env.update(extra)
    return env


def run(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BLKPILOT, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


# BLKPILOT_READY_TIMEOUT: seconds of a quiet host a start may take (default 90); never more
# than READY_CAP_S of the wall clock, however loaded the host
READY_TIMEOUT_ENV = "BLKPILOT_READY_TIMEOUT"
READY_CAP_S = 900.0


def ready_budget(default: float = 90.0) -> float:
    return float(os.environ.get(READY_TIMEOUT_ENV, default))


def host_pressure() -> float:
    """How many times over the host's CPUs are asked for: the 1-minute load per CPU, at
    least 1 (a quiet host)."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def wait_ready(
    url: str,
    process: subprocess.Popen[Any],
    timeout: float | None = None,
    verify: ssl.SSLContext | bool = True,
) -> float:
    """Seconds until GET url answers 200; fails if the process dies first. The wait adapts to
    the host: `timeout` (default BLKPILOT_READY_TIMEOUT, or 90) is seconds of a quiet host,
    and a second of waiting spends 1/pressure of it while the host is loaded pressure times
    over its CPUs — so a start that took 20 s quiet and 4 minutes at load 25 is waited for
    (a fixed 90 s failed benches before they measured anything), up to READY_CAP_S."""
    budget = ready_budget() if timeout is None else timeout
    started = last = time.monotonic()
    spent = 0.0
    while spent < budget and last - started < READY_CAP_S:
        if process.poll() is not None:
            raise AssertionError(f"process exited with {process.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=2, verify=verify).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.2)
        now = time.monotonic()
        spent += (now - last) / host_pressure()
        last = now
    raise AssertionError(
        f"{url} not ready after {last - started:.0f} s ({budget:.0f} s of a quiet host;"
        f" {READY_TIMEOUT_ENV} sets it)"
    )


def start_serve(data_dir: Path, env: dict[str, str], port: int) -> subprocess.Popen[str]:
    """`blkpilot serve` on loopback, its output in data_dir/serve.log."""
    with (data_dir / "serve.log").open("w") as log:
        return subprocess.Popen(
            [BLKPILOT, "serve", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )


def start_replicas(
    data_dir: Path,
    env: dict[str, str],
    count: int,
    servers: list[subprocess.Popen[str]],
    timeout: float = 120,
) -> list[str]:
    """`count` `serve` processes on env's database, one after the other (each upgrades the
    schema at start), each logging in data_dir/replica-N. They join `servers` as they start, so
    that the caller's cleanup stops those that did. Returns their base URLs."""
    bases = []
    for replica in range(count):
        port = free_port()
        bases.append(f"http://127.0.0.1:{port}")
        (data_dir / f"replica-{replica}").mkdir()
        servers.append(start_serve(data_dir / f"replica-{replica}", env, port))
        wait_ready(f"{bases[-1]}/readyz", servers[-1], timeout=timeout)
    return bases


def stop_embedded(data_dir: Path, timeout: float = 30) -> None:
    """Stop an embedded PostgreSQL left running in data_dir (its `serve` was killed, or never
    got as far as stopping it): fast shutdown, then SIGKILL."""
    pidfile = data_dir / "postgres" / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop(process: subprocess.Popen[str], sig: signal.Signals = signal.SIGTERM) -> int:
    process.send_signal(sig)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


@dataclass
class ServiceProcess:
    """`blkpilot serve` on the embedded database in data_dir, started and stopped by tests."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    admin: str = ""
    process: subprocess.Popen[str] | None = None
    settings: dict[str, str] = field(default_factory=dict)  # BLKPILOT_* for `serve`
    ca_bundle: Path | None = None  # with BLKPILOT_TLS_*: what its certificate chains to
    ready_timeout: float | None = None  # seconds of a quiet host `start` waits (wait_ready)

    @property
    def env(self) -> dict[str, str]:
        return {**clean_env(self.data_dir), **self.settings}

    @property
    def base_url(self) -> str:
        scheme = "https" if "BLKPILOT_TLS_CERTFILE" in self.settings else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        if self.ca_bundle is None:
            return True
        return ssl.create_default_context(cafile=str(self.ca_bundle))

    def start(self) -> None:
        self.process = start_serve(self.data_dir, self.env, self.port)
        try:
            wait_ready(
                f"{self.base_url}/readyz",
                self.process,
                timeout=self.ready_timeout,
                verify=self.verify,
            )
        except BaseException:
            # a fixture that gives up stops what it started: `serve`, and the embedded
            # PostgreSQL it may have left (found running an hour after a loaded suite ended)
            with contextlib.suppress(Exception):
                self.stop()
            raise

    def stop(self) -> int:
        """SIGTERM, and its exit status. A `serve` that did not exit cleanly may have left
        its embedded PostgreSQL behind: that is stopped too (a clean exit lets go of it
        itself, and another process may still hold it)."""
        assert self.process is not None
        code = None
        try:
            code = stop(self.process)
            return code
        finally:
            self.process = None
            if code != 0:
                stop_embedded(self.data_dir)

    def create_admin(self, name: str = "admin") -> str:
        result = run(
            "token", "create", "--bootstrap", "--name", name, "--role", "admin", env=self.env
        )
        assert result.returncode == 0, result.stderr
        self.admin = result.stdout.split()[-1]
        return self.admin

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin}"}
        return httpx.request(
            method, f"{self.base_url}/api/v1{path}", headers=headers, verify=self.verify, **kwargs
        )


def run_playbook(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The real ansible-playbook from this environment, in playbooks/ with its ansible.cfg,
    no BLKPILOT_* setting of the caller's leaking into what it runs."""
    root = Path(__file__).resolve().parents[1]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BLKPILOT_")},
        "ANSIBLE_CONFIG": str(root / "playbooks" / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1100,
        cwd=root / "playbooks",
    )


def assert_unit_verifies(unit: Path) -> None:
    """systemd-analyze accepts the unit file (syntax, directives, an ExecStart that exists)."""
    import shutil

    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze (Debian's systemd package)"
    verified = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert verified.returncode == 0, verified.stderr
