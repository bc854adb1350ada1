"""Who else sets a device's queue attributes (issue 70, item 1): udev rules and the active TuneD
profile, read for a real loop device from a fixture tree of rules files (this machine runs no
udev daemon, and `udevadm test` creates device links on the host) and from TuneD's own profile
files as Debian's `tuned` package installs them; reported with the device's inventory and shown
by `blkpilot devices show` and the dashboard (tests/service/test_device_owners.py)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from agent.contract.owned import owned_by
from agent.contract.wire import OwnerKind
from agent.discovery import KernelFacts, describe
from agent.effects import Effects
from agent.host import HostPaths
from agent.owners import owners
from tests.agent.conftest import LoopFactory

TUNED = Path("/usr/lib/tuned")  # Debian's tuned, which make installs (its profiles only are read)

# systemd's own rule for the schedulers of slow devices (as Ubuntu ships it), and rules of the
# kinds administrators write, with a GOTO the reader does not follow
DISTRIBUTION = """\
# Set the scheduler of slow devices
ACTION=="add", SUBSYSTEM=="block", \\
  KERNEL=="mmcblk*[0-9]|msblk*[0-9]|mspblk*[0-9]|sd*[!0-9]|sr*", \\
  ENV{DEVTYPE}=="disk", ATTR{queue/scheduler}="bfq"
ACTION=="add|change", SUBSYSTEM=="block", KERNEL=="loop*", ATTR{queue/rotational}=="0", \\
  ATTR{queue/scheduler}="none"
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for directory in ("etc/udev/rules.d", "usr/lib/udev/rules.d", "etc/tuned", "run"):
        (tmp_path / directory).mkdir(parents=True)
    return tmp_path


def _paths(tree: Path) -> HostPaths:
    """The machine's own sysfs (the loop device is real), rules and profiles from the tree."""
    return replace(HostPaths(), etc=tree / "etc", lib=tree / "usr" / "lib", run=tree / "run")


def test_udev_rules_that_set_the_device_are_found(tree: Path, loop_device: LoopFactory) -> None:
    name = loop_device()
    rules = tree / "usr/lib/udev/rules.d"
    (rules / "60-block-scheduler.rules").write_text(DISTRIBUTION)
    (rules / "90-replaced.rules").write_text(f'KERNEL=="{name}", ATTR{{queue/nr_requests}}="8"\n')
    mine = tree / "etc/udev/rules.d"
    # the administrator's file of the same name replaces the distribution's
    (mine / "90-replaced.rules").write_text("# emptied here\n")
    (mine / "70-ours.rules").write_text(
        f'SUBSYSTEM=="block", KERNEL=="{name}", ATTR{{queue/read_ahead_kb}}="1024"\n'
        # a parent's attribute: not judged here, so it may apply
        f'KERNEL=="{name}", ATTRS{{vendor}}=="ACME", ATTR{{queue/iosched/fifo_batch}}="4"\n'
        # rotational: a loop device is not; never applies
        f'KERNEL=="{name}", ATTR{{queue/rotational}}=="1", ATTR{{queue/scheduler}}="bfq"\n'
        'KERNEL=="nvme*", ATTR{queue/scheduler}="none"\n'
        'ACTION=="remove", GOTO="end"\nLABEL="end"\n'
    )
    found = owners(_paths(tree), name)
    by_source = {o.source: o for o in found}
    assert set(by_source) == {
        "60-block-scheduler.rules:5",
        "70-ours.rules:1",
        "70-ours.rules:2",
    }, found
    assert all(o.kind is OwnerKind.UDEV for o in found)
    assert by_source["60-block-scheduler.rules:5"].settings == {"scheduler": "none"}
    assert by_source["70-ours.rules:1"].settings == {"read_ahead_kb": "1024"}
    maybe = by_source["70-ours.rules:2"]
    assert maybe.settings == {"iosched/fifo_batch": "4"}
    assert not maybe.certain
    assert by_source["70-ours.rules:1"].certain
    assert owned_by(by_source["70-ours.rules:1"].model_dump(mode="json")) == (
        "udev rule 70-ours.rules:1 (read_ahead_kb=1024)"
    )
    assert owned_by(maybe.model_dump(mode="json")).endswith(", may apply")


def test_a_later_rule_is_what_the_device_ends_with(tree: Path, loop_device: LoopFactory) -> None:
    name = loop_device()
    rules = tree / "etc/udev/rules.d"
    (rules / "60-first.rules").write_text(f'KERNEL=="{name}", ATTR{{queue/scheduler}}="bfq"\n')
    (rules / "99-last.rules").write_text('KERNEL=="loop*", ATTR{queue/scheduler}:="mq-deadline"\n')
    (found,) = owners(_paths(tree), name)
    assert found.source == "99-last.rules:1"
    assert found.settings == {"scheduler": "mq-deadline"}


def test_the_active_tuned_profile_and_what_it_includes(
    tree: Path, loop_device: LoopFactory
) -> None:
    """A profile of the administrator's own including Debian's throughput-performance (its
    [disk] readahead=>4096, read from the package's file), with an elevator for loop devices."""
    name = loop_device()
    shutil.copytree(TUNED / "throughput-performance", tree / "usr/lib/tuned/throughput-performance")
    ours = tree / "etc/tuned/blkpilot-test"
    ours.mkdir()
    (ours / "tuned.conf").write_text(
        "[main]\ninclude=throughput-performance\n\n[loops]\ntype=disk\ndevices=loop*\n"
        "elevator=mq-deadline\n"
    )
    (tree / "etc/tuned/active_profile").write_text("blkpilot-test\n")
    (found,) = owners(_paths(tree), name)
    assert found.kind is OwnerKind.TUNED
    assert found.settings == {"read_ahead_kb": ">4096", "scheduler": "mq-deadline"}
    assert found.source == (
        "blkpilot-test (throughput-performance/tuned.conf [disk], blkpilot-test/tuned.conf [loops])"
    )
    # the profile's own [disk] merged with its parent's leaves the device out (readahead too);
    # no active profile: no owner
    (ours / "tuned.conf").write_text(
        "[main]\ninclude=throughput-performance\n\n[disk]\ndevices=!loop*\nelevator=bfq\n"
    )
    assert owners(_paths(tree), name) == []
    (tree / "etc/tuned/active_profile").write_text("")
    assert owners(_paths(tree), name) == []


def test_the_inventory_carries_them(tree: Path, loop_device: LoopFactory) -> None:
    name = loop_device()
    (tree / "etc/udev/rules.d/70-ours.rules").write_text(
        f'KERNEL=="{name}", ATTR{{queue/scheduler}}="bfq"\n'
    )
    paths = _paths(tree)
    inventory = describe(paths, name, KernelFacts.of(paths), Effects()).inventory
    assert [o.settings for o in inventory.owners] == [{"scheduler": "bfq"}]
