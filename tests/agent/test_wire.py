from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from pydantic import ValidationError

from agent.contract.tunables import QUEUE_LIMITS, SCHEDULER_TUNABLES, DeviceConfig, Scheduler
from agent.contract.wire import TelemetryWindow, parse_kernel_version
from tests.factories import telemetry_window


class TestDeviceConfig:
    @pytest.mark.parametrize("scheduler", list(Scheduler))
    def test_every_allowed_tunable_accepts_its_bounds(self, scheduler: Scheduler) -> None:
        for name, (low, high) in SCHEDULER_TUNABLES[scheduler].items():
            for value in (low, high):
                DeviceConfig(scheduler=scheduler, scheduler_tunables={name: value})

    @pytest.mark.parametrize("scheduler", list(Scheduler))
    def test_every_allowed_tunable_refuses_just_outside(self, scheduler: Scheduler) -> None:
        for name, (low, high) in SCHEDULER_TUNABLES[scheduler].items():
            for value in (low - 1, high + 1):
                with pytest.raises(ValidationError, match=name):
                    DeviceConfig(scheduler=scheduler, scheduler_tunables={name: value})

    def test_tunable_of_another_scheduler_is_refused(self) -> None:
        with pytest.raises(ValidationError, match="kyber has no tunable 'slice_idle_us'"):
            DeviceConfig(scheduler=Scheduler.KYBER, scheduler_tunables={"slice_idle_us": 0})

    def test_none_has_no_tunables(self) -> None:
        with pytest.raises(ValidationError, match="allowed: none"):
            DeviceConfig(scheduler=Scheduler.NONE, scheduler_tunables={"anything": 1})

    @pytest.mark.parametrize("name", sorted(set(QUEUE_LIMITS) - {"io_poll_delay"}))
    def test_queue_limits(self, name: str) -> None:
        low, high = QUEUE_LIMITS[name]
        DeviceConfig.model_validate({name: low})
        with pytest.raises(ValidationError, match=name):
            DeviceConfig.model_validate({name: high + 1})

    def test_unknown_field_is_refused(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            DeviceConfig.model_validate({"rq_affinity": 2})


class TestTelemetryWindow:
    def test_valid(self) -> None:
        window = TelemetryWindow.model_validate(telemetry_window())
        assert window.read_share == 0.8

    def test_energy_needs_scope(self) -> None:
        with pytest.raises(ValidationError, match="power_scope"):
            TelemetryWindow.model_validate(telemetry_window(energy_joules=1.0))

    def test_scope_without_reading_is_refused(self) -> None:
        with pytest.raises(ValidationError, match="without a power reading"):
            TelemetryWindow.model_validate(telemetry_window(power_scope="system"))

    def test_window_longer_than_an_hour_is_refused(self) -> None:
        start = datetime.fromisoformat(telemetry_window()["start"])
        end = (start + timedelta(hours=1, seconds=1)).isoformat()
        with pytest.raises(ValidationError, match="at most"):
            TelemetryWindow.model_validate(telemetry_window(end=end))


@pytest.mark.parametrize(
    ("release", "expected"),
    [
        ("6.1.0-18-amd64", (6, 1)),
        ("5.15.0-91-generic", (5, 15)),
        ("6.18.44-fc-v669", (6, 18)),
        ("junk", (0, 0)),
    ],
)
def test_parse_kernel_version(release: str, expected: tuple[int, int]) -> None:
    assert parse_kernel_version(release) == expected
