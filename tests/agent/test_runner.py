"""The agent's loop against a real service process, on real loop devices."""

from __future__ import annotations

import errno
import logging
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.applier import Applier
from agent.config import AgentConfig, PowerConfig
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.exporter import AgentCollector, exposition, registry_for
from agent.host import HostPaths
from agent.runner import Agent
from agent.spool import Spool
from agent.state import NodeState
from tests.agent.conftest import NO_POWER, LoopFactory, enroll_lab_node
from tests.proc import ServiceProcess, clean_env, free_port, stop

pytestmark = pytest.mark.slow


def _meter(path: Path) -> Callable[[], None]:
    """An external meter logging 150 W, one line per call, with the current time."""
    path.write_text("timestamp,watts\n")

    def tick() -> None:
        with path.open("a") as handle:
            handle.write(f"{datetime.now(UTC).isoformat()},150\n")

    return tick


def _read_some(device: str) -> None:
    subprocess.run(
        ["dd", f"if=/dev/{device}", "of=/dev/null", "bs=4k", "count=2000", "iflag=direct"],
        check=True,
        capture_output=True,
    )


def _drive(agent: Agent, seconds: float, *, each: Callable[[], None] = lambda: None) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        each()
        time.sleep(min(agent.step(), 0.05))


def _stored(service: ServiceProcess, node: NodeState) -> dict[str, list[dict[str, Any]]]:
    devices = service.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
    return {
        d["name"]: service.api(
            "GET", f"/devices/{d['id']}/telemetry", params={"limit": 10_000}
        ).json()
        for d in devices
    }


def test_outage_spools_and_delivers_every_window_once(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    fast, slow = loop_device(on="tmpfs"), loop_device(on="disk")
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir)
    meter = _meter(tmp_path / "meter.csv")
    config = AgentConfig(
        devices=[fast, slow],
        interval_s=0.2,
        push_interval_s=0.5,
        policy_interval_s=5,
        metrics_port=0,
        power=PowerConfig(rapl=False, hwmon=False, ipmi=False, meter_csv=tmp_path / "meter.csv"),
    )
    agent = Agent(config, node, state_dir)
    meter()
    agent.start()

    def busy() -> None:
        meter()
        _read_some(fast)

    _drive(agent, 1.5, each=busy)
    assert agent.view.spool_batches == 0

    assert service.stop() == 0  # the outage
    _drive(agent, 1.5, each=meter)
    assert agent.view.spool_batches > 0, "windows collected during the outage wait on disk"
    spooled = agent.view.spool_batches

    service.start()  # back, same database
    _drive(agent, 1.0, each=meter)
    agent.push()
    assert agent.view.spool_batches == 0
    assert spooled > 0

    stored = _stored(service, node)
    total = sum(len(windows) for windows in stored.values())
    assert total == agent.counters.windows_collected
    assert agent.counters.windows_sent == total  # delivery checkable against collection
    delivery = {
        s.name: s.value
        for f in AgentCollector(agent).collect()
        for s in f.samples
        if s.name.startswith("blkpilot_agent_windows")
    }
    assert delivery == {
        "blkpilot_agent_windows_collected_total": total,
        "blkpilot_agent_windows_sent_total": total,
    }
    for name, windows in stored.items():
        starts = [w["window_start"] for w in windows]
        assert len(starts) == len(set(starts)), f"{name} has duplicate windows"
    assert any(w["iops"] > 0 for w in stored[fast])
    powered = [w for w in stored[fast] if w["power_source"] == "meter"]
    assert powered, "the meter's readings reach the service"
    assert powered[0]["power_watts"] == pytest.approx(150.0, rel=0.05)
    assert powered[0]["bytes_per_joule"] is not None

    exported = {
        (sample.name, sample.labels.get("device") or sample.labels.get("source")): sample.value
        for family in text_string_to_metric_families(generate_latest(registry_for(agent)).decode())
        for sample in family.samples
    }
    assert exported[("blkpilot_node_power_watts", "meter")] == pytest.approx(150.0, rel=0.05)
    assert exported[("blkpilot_node_energy_joules_total", "meter")] > 0
    assert ("blkpilot_device_bytes_per_joule", fast) in exported


def test_policies_are_applied_reported_and_drift_is_noticed(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    good, bad = loop_device(), loop_device()
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir)
    # the host's udev rules, as a fixture tree: one of them sets the good device's scheduler
    rules = tmp_path / "etc" / "udev" / "rules.d"
    rules.mkdir(parents=True)
    (rules / "70-admin.rules").write_text(
        f'KERNEL=="{good}", ATTR{{queue/scheduler}}="mq-deadline"\n'
    )
    config = AgentConfig(
        devices=[good, bad],
        metrics_port=0,
        power=PowerConfig(rapl=False, hwmon=False, ipmi=False),
        etc_root=tmp_path / "etc",
        lib_root=tmp_path / "lib",
    )
    agent = Agent(config, node, state_dir)
    agent.start()
    ids = {
        d["name"]: d["id"]
        for d in service.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
    }
    set_good = service.api(
        "PUT",
        f"/devices/{ids[good]}/policy",
        json={
            "config": {"scheduler": "bfq", "scheduler_tunables": {"slice_idle_us": 0}},
            "reason": "test",
        },
    )
    assert set_good.status_code == 200, set_good.text
    # within the allow-list, so the service takes it; but with `none` the kernel refuses a
    # queue deeper than the device's tags
    set_bad = service.api(
        "PUT",
        f"/devices/{ids[bad]}/policy",
        json={
            "config": {"scheduler": "none", "nr_requests": 4096},
            "reason": "too deep",
        },
    )
    assert set_bad.status_code == 200

    agent.sync_policies()
    assert Path(f"/sys/block/{good}/queue/scheduler").read_text().split()[3] == "[bfq]"
    assert Path(f"/sys/block/{good}/queue/iosched/slice_idle_us").read_text().strip() == "0"
    good_policy = service.api("GET", f"/devices/{ids[good]}/policy").json()
    assert good_policy["in_sync"] is True
    bad_policy = service.api("GET", f"/devices/{ids[bad]}/policy").json()
    assert bad_policy["applied"]["status"] == "rolled_back"
    assert "EINVAL" in bad_policy["applied"]["detail"]
    assert Path(f"/sys/block/{bad}/queue/nr_requests").read_text().strip() == "128"

    Path(f"/sys/block/{good}/queue/scheduler").write_text("kyber")  # by no owner it knows
    agent.sync_policies()
    agent.sync_policies()  # reported once, not on every check
    drift = service.api("GET", "/audit", params={"action": "device.drift"}).json()
    assert len(drift) == 1
    assert "scheduler: 'kyber', not 'bfq'" in drift[0]["detail"]
    assert ", by " not in drift[0]["detail"]
    drifted = {d.attribute: d.actual for d in agent.view.drift[good]}
    # the tunable went with the scheduler it belonged to
    assert drifted == {"scheduler": "kyber", "iosched/slice_idle_us": None}

    text = generate_latest(registry_for(agent)).decode()
    # what the agent's own server writes is what prometheus_client would have written
    assert exposition(AgentCollector(agent).parts()).decode() == text
    samples = {
        (s.name, s.labels.get("device"), s.labels.get("scheduler")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("blkpilot_device_drift", good, None)] == 2

    # the change a known owner makes (issue 70) is said as its change, and under the default
    # owner policy (take_over) the agent applies the policy again, once for that change
    Path(f"/sys/block/{good}/queue/scheduler").write_text("mq-deadline")  # as the rule does
    agent.sync_policies()
    agent.sync_policies()
    drift = service.api("GET", "/audit", params={"action": "device.drift"}).json()
    assert len(drift) == 2
    assert (
        "scheduler: 'mq-deadline', not 'bfq', by udev rule 70-admin.rules:1"
        " (scheduler=mq-deadline)" in drift[0]["detail"]
    ), drift[0]["detail"]
    assert Path(f"/sys/block/{good}/queue/scheduler").read_text().split()[3] == "[bfq]"
    assert good not in agent.view.drift
    assert agent.counters.applies["taken_over"] == 1
    good_policy = service.api("GET", f"/devices/{ids[good]}/policy").json()
    assert good_policy["applied"]["status"] == "applied"
    assert good_policy["applied"]["detail"].startswith("taken back over: "), good_policy
    assert "by udev rule 70-admin.rules:1" in good_policy["applied"]["detail"]
    devices = service.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
    (owner,) = next(d for d in devices if d["name"] == good)["owners"]
    assert owner["source"] == "70-admin.rules:1"
    assert samples[("blkpilot_agent_policy_applies_total", None, None)] >= 0


def test_another_blkpilot_change_after_the_policy_is_drift_from_the_policy(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    """Found by bench/soak.py: a rollout's recovery put back a capture taken before the agent
    re-applied the device's policy, and the policy showed applied and in sync over a device on
    another scheduler. A change through blkpilot itself (the applier's record then holds it,
    not the policy) is now drift from the policy — except while a canary holds the device."""
    device = loop_device()
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir)
    config = AgentConfig(devices=[device], metrics_port=0, power=NO_POWER)
    agent = Agent(config, node, state_dir)
    agent.start()
    (found,) = service.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
    body = {"config": {"scheduler": "kyber"}, "reason": "test"}
    assert service.api("PUT", f"/devices/{found['id']}/policy", json=body).status_code == 200
    agent.sync_policies()
    policy = service.api("GET", f"/devices/{found['id']}/policy").json()
    assert policy["in_sync"] is True

    other = Applier(HostPaths(), state_dir)  # what a rollout's restore does, in its own process
    with other.device_lock(device):
        other.apply(device, DeviceConfig(scheduler=Scheduler.MQ_DEADLINE))
        agent.sync_policies()  # held: between configurations, not drift
        assert device not in agent.view.drift
    agent.sync_policies()
    (drift,) = agent.view.drift[device]
    assert (drift.attribute, drift.expected, drift.actual) == (
        "scheduler (policy)",
        "kyber",
        "mq-deadline",
    )
    policy = service.api("GET", f"/devices/{found['id']}/policy").json()
    assert policy["in_sync"] is False
    assert policy["applied"]["status"] == "drift"
    # put back (a rollout's recovery did it in the soak): the service hears it is in line again
    other.apply(device, DeviceConfig(scheduler=Scheduler.KYBER))
    agent.sync_policies()
    assert device not in agent.view.drift
    policy = service.api("GET", f"/devices/{found['id']}/policy").json()
    assert policy["in_sync"] is True
    assert policy["applied"]["status"] == "applied"
    assert "drift resolved" in policy["applied"]["detail"]


def test_a_configuration_changed_outside_policies_is_reported_at_the_next_check(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    """The nightly job recommends from what a device runs: a scheduler switched by hand, by
    udev or by a sweep that finished reaches the service at the agent's next policy check, not
    an inventory interval (10 min) later. While a canary or sweep holds the device, what it runs
    is only for the measurement and is not reported."""
    device = loop_device()
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir)
    config = AgentConfig(
        devices=[device], metrics_port=0, power=PowerConfig(rapl=False, hwmon=False, ipmi=False)
    )
    agent = Agent(config, node, state_dir)
    agent.start()
    queue = Path(f"/sys/block/{device}/queue")

    def reported() -> tuple[str, dict[str, int]]:
        (row,) = service.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
        return row["capabilities"]["current_scheduler"], row["capabilities"]["scheduler_tunables"]

    assert reported() == ("none", {})
    with agent.applier.device_lock(device):  # a canary measures bfq
        (queue / "scheduler").write_text("bfq")
        agent.sync_policies()
        assert reported() == ("none", {})
        (queue / "scheduler").write_text("none")  # and puts it back
    agent.sync_policies()
    assert reported() == ("none", {})

    (queue / "scheduler").write_text("mq-deadline")  # an operator, or udev
    agent.sync_policies()
    scheduler, tunables = reported()
    assert scheduler == "mq-deadline"
    assert tunables["read_expire"] == int((queue / "iosched" / "read_expire").read_text())
    (queue / "iosched" / "read_expire").write_text("100")  # a tunable is a change too
    agent.sync_policies()
    assert reported()[1]["read_expire"] == 100
    events = service.api("GET", "/audit", params={"action": "device.config_changed"}).json()
    assert events, "the service audits what the agent reported"


def test_agent_run_command_serves_metrics_and_spools_offline(
    loop_device: LoopFactory, tmp_path: Path
) -> None:
    device = loop_device()
    port = free_port()
    process = subprocess.Popen(
        [
            str(Path(__import__("sys").executable).parent / "blkpilot"),
            "agent",
            "run",
            "--offline",
            "--state-dir",
            str(tmp_path / "agent"),
            "--device",
            device,
            "--interval",
            "0.2",
            "--push-interval",
            "0.4",
            "--metrics-port",
            str(port),
        ],
        env=clean_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                if f'blkpilot_device_iops{{class="virtual",device="{device}"}}' in text:
                    break  # a first window exists
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        names = {f.name for f in text_string_to_metric_families(text)}
        for expected in (
            "blkpilot_device_info",
            "blkpilot_device_scheduler_info",
            "blkpilot_device_reads_completed",
            "blkpilot_device_iops",
            "blkpilot_device_latency_seconds",
            "blkpilot_node_cpu_utilisation_ratio",
            "blkpilot_node_context_switches",
            "blkpilot_agent_spool_batches",
            "blkpilot_agent_windows_collected",
            "blkpilot_agent_windows_sent",
            "blkpilot_agent_collector_success",
        ):
            assert expected in names, expected
        assert (
            f'blkpilot_device_scheduler_info{{class="virtual",device="{device}",'
            'scheduler="none"} 1.0' in text
        )
        # nothing measures power on this machine: the only power is the estimate from CPU
        # time, labelled as such
        power = [
            sample
            for family in text_string_to_metric_families(text)
            if family.name == "blkpilot_node_power_watts"
            for sample in family.samples
        ]
        assert power
        assert {(s.labels["source"], s.labels["scope"]) for s in power} == {
            ("estimate", "estimated")
        }
    finally:
        assert stop(process) == 0
    assert Spool(tmp_path / "agent" / "spool").pending(), "offline: everything stays spooled"


def test_a_rollback_by_hand_pauses_the_policy_until_it_changes_or_is_resumed(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    """`blkpilot agent rollback` on a device a policy changed: the agent neither re-applies
    the policy nor reports drift; the service shows the policy paused, with why. `agent
    resume` ends it (the policy is applied again); so does a newer policy version."""
    from tests.proc import BLKPILOT

    device = loop_device()
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir)
    agent = Agent(AgentConfig(devices=[device], metrics_port=0, power=NO_POWER), node, state_dir)
    agent.start()
    (found,) = service.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
    policy_url = f"/devices/{found['id']}/policy"
    service.api("PUT", policy_url, json={"config": {"scheduler": "kyber"}, "reason": "test"})
    agent.sync_policies()
    scheduler = Path(f"/sys/block/{device}/queue/scheduler")
    assert "[kyber]" in scheduler.read_text()

    rolled = subprocess.run(
        [BLKPILOT, "agent", "rollback", device, "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert rolled.returncode == 0, rolled.stderr
    assert "paused on this node" in rolled.stdout
    assert "[none]" in scheduler.read_text()
    status = subprocess.run(
        [BLKPILOT, "agent", "status", "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert f"{device}: policy v1 PAUSED on this node" in status
    agent.sync_policies()
    agent.sync_policies()
    assert "[none]" in scheduler.read_text()  # not re-applied
    shown = service.api("GET", policy_url).json()
    assert shown["applied"]["status"] == "paused"
    assert "rolled back by hand" in shown["applied"]["detail"]
    assert service.api("GET", "/audit", params={"action": "device.drift"}).json() == []
    paused = service.api("GET", "/audit", params={"action": "policy.paused"}).json()
    assert len(paused) == 1  # said once

    resumed = subprocess.run(
        [BLKPILOT, "agent", "resume", device, "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    agent.sync_policies()
    assert "[kyber]" in scheduler.read_text()
    assert service.api("GET", policy_url).json()["applied"]["status"] == "applied"

    # paused again; a newer policy version ends it
    subprocess.run(
        [BLKPILOT, "agent", "rollback", device, "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    agent.sync_policies()
    assert "[none]" in scheduler.read_text()
    service.api("PUT", policy_url, json={"config": {"scheduler": "bfq"}, "reason": "newer"})
    agent.sync_policies()
    assert "[bfq]" in scheduler.read_text()
    scheduler.write_text("none")


def test_a_spool_that_cannot_be_written_does_not_stop_the_agent(
    loop_device: LoopFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk under the spool: collection goes on, the windows wait in memory and are
    spooled once it can be written again — none lost, the failures counted and exported."""
    device = loop_device()
    config = AgentConfig(
        devices=[device], interval_s=0.1, push_interval_s=100, metrics_port=0, power=NO_POWER
    )
    agent = Agent(config, None, tmp_path / "agent")  # offline: it collects and spools
    agent.start()
    writes = agent.spool.add

    def full(windows: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(agent.spool, "add", full)
    _drive(agent, 0.8)
    assert agent.counters.windows_collected > 0
    assert agent.counters.spool_write_failures > 0
    assert agent.spool.pending() == []
    exported = {s.name: s.value for f in AgentCollector(agent).collect() for s in f.samples}
    assert exported["blkpilot_agent_spool_write_failures_total"] > 0
    monkeypatch.setattr(agent.spool, "add", writes)
    _drive(agent, 0.3)
    spooled = sum(len(Spool.load(path).windows) for path in agent.spool.pending())
    assert spooled == agent.counters.windows_collected  # none lost
    assert agent.counters.windows_unspooled_dropped == 0


def test_an_action_that_raises_does_not_stop_the_others(
    loop_device: LoopFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A loop action that raises (here the inventory, as a sysfs file that cannot be read or a
    bug would) is counted, exported and logged once per streak; collection goes on, and the
    action is tried again at its next turn."""
    device = loop_device()
    config = AgentConfig(
        devices=[device],
        interval_s=0.1,
        push_interval_s=100,
        inventory_interval_s=0.1,
        metrics_port=0,
        power=NO_POWER,
    )
    agent = Agent(config, None, tmp_path / "agent")
    agent.start()
    works = agent.discover_and_report

    def unreadable() -> None:
        raise OSError(errno.EIO, "Input/output error", f"/sys/block/{device}/queue/scheduler")

    monkeypatch.setattr(agent, "discover_and_report", unreadable)
    collected = agent.counters.windows_collected
    with caplog.at_level(logging.WARNING, logger="agent.runner"):
        _drive(agent, 0.8)
        failures = agent.counters.action_failures["inventory"]
        assert failures >= 2
        assert agent.counters.windows_collected > collected  # collection went on
        logged = [r for r in caplog.records if "inventory failed" in r.getMessage()]
        assert len(logged) == 1  # once for the streak, with its traceback
        assert logged[0].exc_info is not None
        exported = {
            (s.name, s.labels.get("action")): s.value
            for f in AgentCollector(agent).collect()
            for s in f.samples
        }
        assert exported[("blkpilot_agent_action_failures_total", "inventory")] == failures
        monkeypatch.setattr(agent, "discover_and_report", works)
        _drive(agent, 0.3)
    assert agent.counters.action_failures["inventory"] == failures  # it works again
    assert any("inventory works again" in r.getMessage() for r in caplog.records)


def _fill(directory: Path) -> None:
    """Fill the file system under `directory` to its last byte."""
    chunk = b"\0" * 65536
    with (directory / "ballast").open("wb", buffering=0) as ballast:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    ballast.write(chunk[:size])
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise


def test_a_full_disk_and_a_fast_clock_lose_no_telemetry_and_leave_no_false_rejects(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    """Issue 64, on a real 1 MiB tmpfs filled to the last byte under the agent's state: every
    failed append left an empty N.jsonl that the next drain counted as a rejected batch, and
    nothing was sent while the spool could not be written. Now nothing is left behind,
    nothing is rejected, and what waits in memory is sent. Then a batch that ends past the
    service's clock skew (the node's clock ahead) is held, said in `status` and the metrics,
    and delivered once real time catches up — where it was set aside for good."""
    from agent.contract.base import MAX_CLOCK_SKEW
    from agent.contract.wire import TelemetryBatch, TelemetryWindow
    from agent.status import node_status
    from tests.factories import telemetry_window

    device = loop_device()
    state_dir = tmp_path / "agent"
    state_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(state_dir)], check=True)
    try:
        node = enroll_lab_node(service, state_dir, [device])
        config = AgentConfig(
            devices=[device], interval_s=0.2, push_interval_s=0.5, metrics_port=0, power=NO_POWER
        )
        agent = Agent(config, node, state_dir)
        agent.start()
        _fill(state_dir)
        _drive(agent, 2.0, each=lambda: _read_some(device))
        agent.push()
        assert agent.counters.spool_write_failures > 0
        assert agent.counters.windows_collected > 0
        assert [p for p in (state_dir / "spool").glob("*.json*") if p.stat().st_size == 0] == []
        assert agent.counters.spool_rejected == 0
        assert not (state_dir / "spool" / "rejected").exists()
        stored = sum(len(w) for w in _stored(service, node).values())
        assert stored == agent.counters.windows_collected  # sent from memory, none lost
        (state_dir / "ballast").unlink()

        # the node's clock ahead: a window ending 3 s past what the service accepts
        end = datetime.now(UTC) + MAX_CLOCK_SKEW + (ahead := timedelta(seconds=3))
        window = telemetry_window(device, index=0)
        window["start"] = (end - timedelta(seconds=10)).isoformat()
        window["end"] = end.isoformat()
        batch = TelemetryBatch(
            batch_id=uuid.uuid4(), windows=[TelemetryWindow.model_validate(window)]
        )
        agent.spool.put(batch)
        agent.push()
        assert agent.counters.batches_held_for_clock == 1
        assert agent.counters.spool_rejected == 0
        assert [Spool.load(p).batch_id for p in agent.spool.pending()] == [batch.batch_id]
        assert any("CLOCK AHEAD" in line for line in node_status(config, state_dir))
        exported = {s.name: s.value for f in AgentCollector(agent).collect() for s in f.samples}
        assert exported["blkpilot_agent_clock_held"] == 1.0
        assert abs(exported["blkpilot_agent_clock_offset_seconds"]) < 5  # this host's one clock
        time.sleep(ahead.total_seconds() + 1)  # real time catches up
        agent.push()
        assert agent.spool.pending() == []
        assert not any("CLOCK AHEAD" in line for line in node_status(config, state_dir))
        assert agent.counters.spool_rejected == 0
    finally:
        subprocess.run(["umount", "-l", str(state_dir)], check=False)


def test_a_policy_that_yields_leaves_another_owners_setting(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    """Issue 70: a policy set to yield is not applied where a udev rule certainly sets what it
    sets; the node says so (status yielded, naming the rule), the device keeps the rule's
    scheduler, and nothing is drift. Without the rule, the same policy applies."""
    device, free = loop_device(), loop_device()
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir)
    rules = tmp_path / "etc" / "udev" / "rules.d"
    rules.mkdir(parents=True)
    (rules / "60-io.rules").write_text(f'KERNEL=="{device}", ATTR{{queue/scheduler}}="none"\n')
    Path(f"/sys/block/{device}/queue/scheduler").write_text("none")  # as the rule set it
    config = AgentConfig(
        devices=[device, free], metrics_port=0, power=NO_POWER, etc_root=tmp_path / "etc"
    )
    agent = Agent(config, node, state_dir)
    agent.start()
    ids = {
        d["name"]: d["id"]
        for d in service.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
    }
    for name in (device, free):
        put = service.api(
            "PUT",
            f"/devices/{ids[name]}/policy",
            json={"config": {"scheduler": "mq-deadline"}, "reason": "test", "owners": "yield"},
        )
        assert put.status_code == 200, put.text
        assert put.json()["owners"] == "yield"
    agent.sync_policies()
    agent.sync_policies()
    assert "[none]" in Path(f"/sys/block/{device}/queue/scheduler").read_text()
    assert "[mq-deadline]" in Path(f"/sys/block/{free}/queue/scheduler").read_text()
    policy = service.api("GET", f"/devices/{ids[device]}/policy").json()
    assert policy["applied"]["status"] == "yielded", policy
    assert "udev rule 60-io.rules:1 (scheduler=none)" in policy["applied"]["detail"]
    assert not policy["in_sync"]
    assert device not in agent.view.drift
    assert agent.counters.applies["yielded"] == 1
    freed = service.api("GET", f"/devices/{ids[free]}/policy").json()
    assert freed["applied"]["status"] == "applied"


def test_a_device_announced_again_gets_its_policy_back_at_once(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    """Issue 70: a loop device removed and added again (as a disk that is hot-plugged or reset:
    the kernel makes a new queue with its default scheduler) gets its policy back as soon as
    the kernel announces it, long before the next policy check (an hour away here)."""
    import fcntl
    import os
    import subprocess

    name = loop_device()
    number = int(name.removeprefix("loop"))
    backing = Path(
        subprocess.run(["losetup", "-n", "-O", "BACK-FILE", f"/dev/{name}"], capture_output=True,
                       text=True, check=True).stdout.strip()
    )  # fmt: skip
    state_dir = tmp_path / "agent"
    node = enroll_lab_node(service, state_dir)
    config = AgentConfig(devices=[name], metrics_port=0, power=NO_POWER, policy_interval_s=3600)
    agent = Agent(config, node, state_dir)
    agent.start()
    (device,) = service.api("GET", "/devices", params={"node_id": str(node.node_id)}).json()
    put = service.api(
        "PUT",
        f"/devices/{device['id']}/policy",
        json={"config": {"scheduler": "bfq"}, "reason": "test"},
    )
    assert put.status_code == 200, put.text
    agent.sync_policies()
    queue = Path(f"/sys/block/{name}/queue/scheduler")
    assert "[bfq]" in queue.read_text()
    agent.step()  # what the start announced is read

    subprocess.run(["losetup", "-d", f"/dev/{name}"], check=True)
    control = os.open("/dev/loop-control", os.O_RDWR)
    try:
        fcntl.ioctl(control, 0x4C81, number)  # LOOP_CTL_REMOVE: the queue goes
        fcntl.ioctl(control, 0x4C80, number)  # LOOP_CTL_ADD: a new one, the kernel's default
    finally:
        os.close(control)
    subprocess.run(["losetup", f"/dev/{name}", str(backing)], check=True)
    assert "[bfq]" not in queue.read_text()
    deadline = time.monotonic() + 10
    while "[bfq]" not in queue.read_text():
        assert time.monotonic() < deadline, queue.read_text()
        assert agent.uevents is not None
        agent.uevents.wait(0.5)
        agent.step()
    assert agent.counters.applies["hotplug"] == 1
    policy = service.api("GET", f"/devices/{device['id']}/policy").json()
    assert policy["applied"]["detail"].startswith("the kernel announced the device again")
    assert policy["in_sync"]
