from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.applier import Applier
from agent.contract.tunables import (
    KERNEL_HZ,
    CompletionMode,
    DeviceConfig,
    Scheduler,
    jiffy_readback,
    jiffy_readbacks,
)
from agent.effects import Effects
from agent.errors import ChangeFailed, ChangeRefused, NoSnapshot
from agent.host import HostPaths
from tests.agent.conftest import LoopFactory
from tests.proc import BLKPILOT

ROOT = Path(__file__).resolve().parents[2]


def queue_state(device: str) -> dict[str, str]:
    """Every readable attribute of the device's queue, tunables included."""
    queue = Path(f"/sys/block/{device}/queue")
    state = {}
    for path in sorted([*queue.iterdir(), *(queue / "iosched").glob("*")]):
        if path.is_file():
            with contextlib.suppress(OSError):
                state[str(path.relative_to(queue))] = path.read_text()
    return state


@pytest.fixture
def applier(tmp_path: Path) -> Applier:
    return Applier(HostPaths(), tmp_path / "agent")


class TestApply:
    def test_writes_reads_back_and_rolls_back(
        self, applier: Applier, loop_device: LoopFactory
    ) -> None:
        device = loop_device()
        original = queue_state(device)
        config = DeviceConfig(
            scheduler=Scheduler.BFQ,
            scheduler_tunables={"slice_idle_us": 0, "low_latency": 0},
            nr_requests=64,
            read_ahead_kb=512,
        )
        result = applier.apply(device, config)
        assert result.before["scheduler"] == "none"
        after = queue_state(device)
        assert "[bfq]" in after["scheduler"]
        assert after["iosched/slice_idle_us"] == "0\n"
        assert after["iosched/low_latency"] == "0\n"
        assert after["nr_requests"] == "64\n"
        assert after["read_ahead_kb"] == "512\n"
        assert applier.drift(device) == []
        applier.rollback(device)
        assert queue_state(device) == original
        with pytest.raises(NoSnapshot):
            applier.rollback(device)

    def test_values_already_in_place_are_not_written_again(
        self, tmp_path: Path, loop_device: LoopFactory
    ) -> None:
        """A canary's A/A applies the baseline as its candidate: writing the scheduler again
        freezes the queue, a cost the rollback (which skips equal values) never pays, so the
        candidate arm looked slower on a CPU-bound application."""
        device = loop_device()
        effects = Effects()
        applier = Applier(HostPaths(), tmp_path / "agent", effects)
        applier.apply(device, DeviceConfig(scheduler=Scheduler.MQ_DEADLINE))
        applier.rollback(device)
        applier.apply(device, DeviceConfig(scheduler=Scheduler.MQ_DEADLINE))
        effects.writes.clear()
        current = applier.current(device)
        result = applier.apply(device, current)  # every value as it already is
        assert result.after["scheduler"] == "mq-deadline"
        assert [path.name for path, _ in effects.writes] == []
        applier.apply(device, DeviceConfig(scheduler=Scheduler.MQ_DEADLINE, nr_requests=32))
        assert [path.name for path, _ in effects.writes] == ["nr_requests"]
        assert applier.drift(device) == []

    def test_out_of_range_value_changes_nothing(
        self, applier: Applier, loop_device: LoopFactory
    ) -> None:
        device = loop_device()
        original = queue_state(device)
        unchecked = DeviceConfig.model_construct(
            scheduler=Scheduler.BFQ, scheduler_tunables={"low_latency": 7}
        )
        with pytest.raises(ChangeRefused, match="low_latency"):
            applier.apply(device, unchecked)
        assert queue_state(device) == original
        assert applier.effects.writes == []

    def test_kernel_einval_restores_what_was_written(
        self, applier: Applier, loop_device: LoopFactory
    ) -> None:
        device = loop_device()
        original = queue_state(device)
        config = DeviceConfig(scheduler=Scheduler.KYBER, completion=CompletionMode.CLASSIC_POLL)
        with pytest.raises(ChangeFailed, match="EINVAL") as failure:
            applier.apply(device, config)
        assert failure.value.restored is True
        written = [str(path) for path, _ in applier.effects.writes]
        assert any(p.endswith("/queue/scheduler") for p in written)  # it got that far
        assert queue_state(device) == original
        assert not (applier.state_dir / "journal.json").exists()

    def test_attribute_off_the_allow_list_is_refused(
        self, applier: Applier, loop_device: LoopFactory
    ) -> None:
        device = loop_device()
        original = queue_state(device)
        for attribute in ("rq_affinity", "../../../../../../etc/hostname", "iosched/../scheduler"):
            with pytest.raises(ChangeRefused):
                applier.read(device, attribute)
        tunable_escape = DeviceConfig.model_construct(
            scheduler=Scheduler.BFQ, scheduler_tunables={"../../../../dev/sda": 1}
        )
        with pytest.raises(ChangeRefused):
            applier.apply(device, tunable_escape)
        assert queue_state(device) == original
        assert applier.effects.writes == []

    @pytest.mark.parametrize("name", ["../vda", "loop0/../../vda", "vda/..", "", "x" * 70])
    def test_device_path_traversal_is_refused(self, applier: Applier, name: str) -> None:
        with pytest.raises(ChangeRefused):
            applier.apply(name, DeviceConfig(scheduler=Scheduler.NONE))
        assert applier.effects.writes == []

    def test_hybrid_polling_is_refused_on_kernels_without_it(
        self, applier: Applier, loop_device: LoopFactory
    ) -> None:
        device = loop_device()
        if applier.kernel.hybrid_polling:
            pytest.fail("this test expects a kernel of 6.4 or later, as on this machine")
        with pytest.raises(ChangeRefused, match=r"6\.4"):
            applier.apply(device, DeviceConfig(completion=CompletionMode.HYBRID_POLL))

    def test_dry_run_records_but_does_not_write(
        self, tmp_path: Path, loop_device: LoopFactory
    ) -> None:
        device = loop_device()
        original = queue_state(device)
        applier = Applier(HostPaths(), tmp_path / "agent", Effects(dry_run=True))
        applier.apply(device, DeviceConfig(scheduler=Scheduler.MQ_DEADLINE, read_ahead_kb=64))
        assert [Path(p).name for p, _ in applier.effects.writes] == ["scheduler", "read_ahead_kb"]
        assert queue_state(device) == original


class TestJiffies:
    """HZ 250 here (and on Debian): ms tunables kept in jiffies read back rounded to a tick.
    The agent took 250 -> 252 for a failed write, rolled it back, and did so at every policy
    fetch; the service's policy showed rolled_back for a value the kernel had accepted."""

    @pytest.mark.parametrize(
        ("scheduler", "tunable", "value"),
        [(Scheduler.MQ_DEADLINE, "read_expire", 250), (Scheduler.BFQ, "timeout_sync", 125)],
    )
    def test_a_value_rounded_to_a_tick_is_applied_and_does_not_drift(
        self,
        applier: Applier,
        loop_device: LoopFactory,
        scheduler: Scheduler,
        tunable: str,
        value: int,
    ) -> None:
        device = loop_device()
        assert applier.kernel.hz in KERNEL_HZ
        expected = jiffy_readback(value, applier.kernel.hz or 250)
        result = applier.apply(
            device, DeviceConfig(scheduler=scheduler, scheduler_tunables={tunable: value})
        )
        on_device = Path(f"/sys/block/{device}/queue/iosched/{tunable}").read_text().strip()
        assert int(on_device) == expected
        assert result.after[f"iosched/{tunable}"] == on_device
        assert applier.drift(device) == []
        applier.rollback(device)

    def test_the_rounding_follows_the_kernel(self) -> None:
        assert jiffy_readback(250, 250) == 252
        assert jiffy_readback(125, 250) == 128
        assert jiffy_readback(250, 1000) == 250
        assert jiffy_readback(1, 100) == 10
        assert jiffy_readbacks(250) == {250, 252}  # HZ 100, 300, 1000 keep 250
        assert jiffy_readbacks(125) == {128, 130, 126, 125}


class TestDrift:
    def test_a_value_changed_behind_our_back_is_reported(
        self, applier: Applier, loop_device: LoopFactory
    ) -> None:
        device = loop_device()
        applier.apply(device, DeviceConfig(scheduler=Scheduler.BFQ, read_ahead_kb=256))
        # what a udev rule or TuneD would do
        Path(f"/sys/block/{device}/queue/scheduler").write_text("mq-deadline")
        drift = {d.attribute: (d.expected, d.actual) for d in applier.drift(device)}
        assert drift == {"scheduler": ("bfq", "mq-deadline")}


class TestRecovery:
    def test_a_change_killed_midway_is_undone_on_restart(
        self, tmp_path: Path, loop_device: LoopFactory
    ) -> None:
        device = loop_device()
        original = queue_state(device)
        state_dir = tmp_path / "agent"
        # A real agent process, killed with SIGKILL right after its first sysfs write.
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

            Applier(HostPaths(), Path({str(state_dir)!r}), DiesAfterFirstWrite()).apply(
                {device!r}, DeviceConfig(scheduler=Scheduler.BFQ, read_ahead_kb=1024)
            )
            """
        )
        killed = subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
        assert killed.returncode == -9
        assert "[bfq]" in queue_state(device)["scheduler"]  # half-applied
        assert (state_dir / "journal.json").exists()

        # a dry run changes nothing, the journal included: it did delete it, unrestored
        half_changed = queue_state(device)
        dry = Applier(HostPaths(), state_dir, Effects(dry_run=True))
        assert dry.recover() is None
        dry.apply(device, DeviceConfig(scheduler=Scheduler.MQ_DEADLINE))
        assert (state_dir / "journal.json").exists()
        assert queue_state(device) == half_changed
        assert not (state_dir / "snapshots").exists() or not list(
            (state_dir / "snapshots").iterdir()
        )

        restarted = Applier(HostPaths(), state_dir)
        assert restarted.recover() == device
        assert queue_state(device) == original
        assert not (state_dir / "journal.json").exists()
        assert restarted.recover() is None

    @pytest.mark.parametrize("keep", [60, 3])  # the device's name survives, or not even that
    def test_an_unreadable_journal_is_set_aside_and_the_device_held(
        self, tmp_path: Path, loop_device: LoopFactory, keep: int
    ) -> None:
        """A truncated journal stopped `agent run` at every start (JSONDecodeError). It is
        moved aside, the device it names (or every device) is held until an operator
        releases it, and nothing else stops."""
        device, other = loop_device(), loop_device()
        state_dir = tmp_path / "agent"
        state_dir.mkdir()
        journal = (
            f'{{"txid": "ab12", "device": "{device}", "snapshot": {{"scheduler": "none"}},'
            ' "writes": {"scheduler": "bfq"}}'
        )
        (state_dir / "journal.json").write_text(journal[:keep])
        applier = Applier(HostPaths(), state_dir)
        assert applier.recover() is None  # no exception
        assert not (state_dir / "journal.json").exists()
        (aside,) = state_dir.glob("journal.unreadable-*.json")
        assert aside.read_text() == journal[:keep]
        held = device if keep == 60 else "*"
        assert list(applier.held()) == [held]
        with pytest.raises(ChangeRefused, match="held"):
            applier.apply(device, DeviceConfig(scheduler=Scheduler.BFQ))
        if held == device:  # the other device is not held
            applier.apply(other, DeviceConfig(scheduler=Scheduler.BFQ))
            applier.rollback(other)
        assert "[none]" in queue_state(device)["scheduler"]
        status = subprocess.run(
            [BLKPILOT, "agent", "status", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert "HELD" in status.stdout, status.stdout + status.stderr
        released = subprocess.run(
            [BLKPILOT, "agent", "release", held, "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert released.returncode == 0, released.stderr
        assert applier.held() == {}
        applier.apply(device, DeviceConfig(scheduler=Scheduler.BFQ))
        applier.rollback(device)


class TestOneDeviceOneChanger:
    """Issue 64 item 7, with real processes on a real loop device."""

    def test_a_canary_after_a_killed_one_begins_from_the_original(
        self, tmp_path: Path, loop_device: LoopFactory
    ) -> None:
        """A canary killed (SIGKILL) in its candidate phase leaves the candidate applied. The
        next canary on the device took that candidate as its baseline, "restored" to it and
        deleted the killed one's marker: nothing put the original back. Now taking the
        device undoes the killed canary first."""
        device = loop_device()
        Path(f"/sys/block/{device}/queue/scheduler").write_text("mq-deadline")
        original = queue_state(device)
        state_dir = tmp_path / "agent"
        script = textwrap.dedent(
            f"""
            import os, signal, sys
            sys.path.insert(0, {str(ROOT)!r})
            from pathlib import Path
            from agent.applier import Applier
            from agent.host import HostPaths
            from agent.contract.tunables import DeviceConfig, Scheduler

            applier = Applier(HostPaths(), Path({str(state_dir)!r}))
            with applier.canary({device!r}):
                applier.apply({device!r}, DeviceConfig(scheduler=Scheduler.BFQ))
                os.kill(os.getpid(), signal.SIGKILL)  # mid-candidate
            """
        )
        killed = subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
        assert killed.returncode == -9
        assert "[bfq]" in queue_state(device)["scheduler"]
        applier = Applier(HostPaths(), state_dir)
        with applier.canary(device) as baseline:
            assert queue_state(device) == original  # the killed canary undone first
            applier.apply(device, DeviceConfig(scheduler=Scheduler.KYBER))
            assert applier.restore_canary_baseline(device, baseline)
        assert queue_state(device) == original

    def test_two_state_directories_share_one_lock_and_the_waiter_says_for_whom(
        self, tmp_path: Path, loop_device: LoopFactory
    ) -> None:
        """A canary by hand with its own --state-dir beside the daemon toggled the scheduler
        against it; the device's lock is now the host's, and a waiter names the holder."""
        device = loop_device()
        script = textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(ROOT)!r})
            from pathlib import Path
            from agent.applier import Applier
            from agent.host import HostPaths

            with Applier(HostPaths(), Path({str(tmp_path / "daemon")!r})).device_lock({device!r}):
                print("held", flush=True)
                time.sleep(3)
                Path({str(tmp_path / "done")!r}).write_text("done")  # the last thing it does
            """
        )
        holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            other = Applier(HostPaths(), tmp_path / "by-hand")
            assert other.busy(device)
            said: list[str] = []
            with other.device_lock(device, on_wait=said.append):
                assert (tmp_path / "done").exists()  # it waited for the holder to finish
            (line,) = said
            assert f"waiting for {device}" in line
            assert f"pid {holder.pid}" in line
        finally:
            holder.kill()
            holder.wait()
