"""A change stopped by a signal restores what was there (issue 31): SIGTERM, SIGINT and SIGHUP
in the middle of `agent apply` and of a synthetic canary; a recovery that cannot restore keeps
its journal and holds the device; a hold list that cannot be read holds every device and
stops nothing. (The live canary's signals are tested beside it, in test_live_canary.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.applier import Applier
from agent.bench.library import library
from agent.canary import run_canary
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.effects import Effects
from agent.errors import ChangeRefused
from agent.fsutil import write_json_atomic
from agent.host import HostPaths
from agent.signals import Interrupted, restoring_on_signals
from tests.agent.conftest import LoopFactory
from tests.agent.test_applier import queue_state
from tests.proc import BLKPILOT

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


class SignalledAfterFirstWrite(Effects):
    """The first sysfs write goes through, then the process receives the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum

    def write_attribute(self, path: Path, value: str) -> None:
        super().write_attribute(path, value)
        if len(self.writes) == 1:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_mid_apply_restores_the_snapshot(
    tmp_path: Path, loop_device: LoopFactory, signum: int
) -> None:
    device = loop_device()
    original = queue_state(device)
    state_dir = tmp_path / "agent"
    applier = Applier(HostPaths(), state_dir, SignalledAfterFirstWrite(signum))
    wanted = DeviceConfig(scheduler=Scheduler.BFQ, read_ahead_kb=1024, nr_requests=64)
    with pytest.raises(Interrupted) as stopped, restoring_on_signals():
        applier.apply(device, wanted)
    assert stopped.value.signum == signum
    assert stopped.value.exit_status == 128 + signum
    assert len(applier.effects.writes) > 1  # the first write happened, then the restore
    assert queue_state(device) == original
    assert not (state_dir / "journal.json").exists()
    assert applier.held() == {}
    # the handlers are the process's own again
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_recovery_that_cannot_restore_keeps_the_journal_and_holds_the_device(
    tmp_path: Path, loop_device: LoopFactory
) -> None:
    device = loop_device()
    state_dir = tmp_path / "agent"
    state_dir.mkdir()
    # a snapshot the kernel refuses to take back (no such scheduler)
    write_json_atomic(
        state_dir / "journal.json",
        {"txid": "t1", "device": device, "snapshot": {"scheduler": "nosuch"}, "writes": {}},
    )
    applier = Applier(HostPaths(), state_dir)
    assert applier.recover() == device
    assert not (state_dir / "journal.json").exists()
    (kept,) = state_dir.glob(f"journal.unrestored-{device}-*.json")
    assert '"nosuch"' in kept.read_text()
    assert "could not be fully restored" in applier.held()[device]
    with pytest.raises(ChangeRefused, match="held"):
        applier.apply(device, DeviceConfig(scheduler=Scheduler.BFQ))


@pytest.mark.parametrize("garbage", ['{"loop0": "why', "[1, 2]", "\udcff"])
def test_an_unreadable_hold_list_holds_every_device_and_stops_nothing(
    tmp_path: Path, loop_device: LoopFactory, garbage: str
) -> None:
    device = loop_device()
    state_dir = tmp_path / "agent"
    state_dir.mkdir()
    (state_dir / "held.json").write_bytes(garbage.encode("utf-8", "surrogateescape"))
    status = subprocess.run(
        [BLKPILOT, "agent", "status", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert "Traceback" not in status.stderr
    assert "HELD" in status.stdout
    (aside,) = state_dir.glob("held.unreadable-*.json")
    assert aside.read_bytes() == garbage.encode("utf-8", "surrogateescape")
    applied = subprocess.run(
        [BLKPILOT, "agent", "apply", device, "--state-dir", str(state_dir), "--scheduler", "bfq"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert applied.returncode == 1
    assert "Traceback" not in applied.stderr
    assert "held" in applied.stderr
    assert "[none]" in queue_state(device)["scheduler"]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_mid_synthetic_canary_restores_the_baseline(
    tmp_path: Path, loop_device: LoopFactory, signum: int
) -> None:
    device = loop_device(on="tmpfs")
    applier = Applier(HostPaths(), tmp_path / "agent")
    scheduler = Path(f"/sys/block/{device}/queue/scheduler")
    sent = threading.Event()

    def signal_once_the_candidate_runs() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "[bfq]" not in scheduler.read_text():
            time.sleep(0.02)
        time.sleep(0.1)  # inside the candidate's round
        os.kill(os.getpid(), signum)
        sent.set()

    threading.Thread(target=signal_once_the_candidate_runs, daemon=True).start()
    with pytest.raises(Interrupted), restoring_on_signals():
        run_canary(
            applier,
            device,
            library()["hs23-single-randread-4k-qd1"],
            DeviceConfig(scheduler=Scheduler.BFQ),
            workdir=tmp_path,
            rounds=20,
            round_seconds=0.5,
        )
    assert sent.is_set()
    assert "[none]" in scheduler.read_text()
    assert not (tmp_path / "agent" / "journal.json").exists()


def test_a_canary_killed_with_sigkill_is_undone_at_the_next_start(
    tmp_path: Path, loop_device: LoopFactory
) -> None:
    """kill -9 cannot be caught: the canary's marker stays, and the agent's next start
    (Applier.recover, as `agent run` calls it) restores the baseline."""
    device = loop_device(on="tmpfs")
    state_dir = tmp_path / "agent"
    scheduler = Path(f"/sys/block/{device}/queue/scheduler")
    argv = [BLKPILOT, "agent", "canary", device, "--mode", "synthetic", "--scheduler", "bfq"]
    argv += ["--rounds", "20", "--round-seconds", "0.5", "--no-report"]
    canary = subprocess.Popen(
        [*argv, "--state-dir", str(state_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while "[bfq]" not in scheduler.read_text():
            assert canary.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)
    finally:
        canary.kill()
        canary.wait()
    assert "[bfq]" in scheduler.read_text()  # left behind, as a kill -9 leaves it
    assert list((state_dir / "canaries").glob("*.json"))
    assert Applier(HostPaths(), state_dir).recover() == device
    assert "[none]" in scheduler.read_text()
    assert not list((state_dir / "canaries").glob("*.json"))


def test_recovery_leaves_a_live_canary_and_a_kept_policy_alone(
    tmp_path: Path, loop_device: LoopFactory
) -> None:
    device = loop_device(on="tmpfs")
    applier = Applier(HostPaths(), tmp_path / "agent")
    applier.apply(device, DeviceConfig(scheduler=Scheduler.MQ_DEADLINE))  # a policy, kept
    with applier.canary(device):  # a canary alive, still on its baseline
        assert Applier(HostPaths(), tmp_path / "agent").recover() is None
        assert (tmp_path / "agent" / "canaries" / f"{device}.json").exists()
    # killed on its baseline: the marker is there, the policy stays
    marker = tmp_path / "agent" / "canaries" / f"{device}.json"
    write_json_atomic(marker, {"device": device, "baseline_txid": applier._applied_txid(device)})
    assert applier.recover() is None
    assert "[mq-deadline]" in Path(f"/sys/block/{device}/queue/scheduler").read_text()
    assert not marker.exists()
    applier.rollback(device)


def test_a_signal_right_after_a_switch_still_restores_the_baseline(
    tmp_path: Path, loop_device: LoopFactory
) -> None:
    """A SIGTERM that lands after the candidate's apply returned but before the canary noted
    the switch left bfq set (1 run in 3 of the CLI's SIGTERM test, once). The canary now
    restores by what is recorded as applied — and only what it applied itself: a policy kept
    before the canary stays."""
    device = loop_device(on="tmpfs")
    applier = Applier(HostPaths(), tmp_path / "agent")
    scheduler = Path(f"/sys/block/{device}/queue/scheduler")
    applier.apply(device, DeviceConfig(scheduler=Scheduler.MQ_DEADLINE))  # a kept policy
    with applier.canary(device) as baseline:
        assert not applier.restore_canary_baseline(device, baseline)  # nothing to undo yet
        applier.apply(device, DeviceConfig(scheduler=Scheduler.BFQ))  # the candidate
        assert applier.restore_canary_baseline(device, baseline)
    assert "[mq-deadline]" in scheduler.read_text()
    scheduler.write_text("none")  # the loop device as it was made
