from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.contract import histograms
from agent.contract.tunables import QUEUE_LIMITS, SCHEDULER_TUNABLES, DeviceConfig, Scheduler
from agent.contract.wire import OperationLatency, TelemetryWindow, parse_kernel_version
from tests.factories import ebpf_window, telemetry_window


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

    def test_distributions_count_what_diskstats_counts(self) -> None:
        """One entry per operation, each within the slack of diskstats' count (COUNT_SLACK:
        1,024 I/Os or 10 %); an operation left out counts none."""
        window = ebpf_window()
        read, write = window["operations"]
        assert TelemetryWindow.model_validate(window)
        with pytest.raises(ValidationError, match="one entry per operation"):
            TelemetryWindow.model_validate({**window, "operations": [read, write, read]})
        ios = window["read_ios"]
        assert TelemetryWindow.model_validate({**window, "read_ios": ios + max(1024, ios // 10)})
        with pytest.raises(ValidationError, match="read latency counts"):
            TelemetryWindow.model_validate({**window, "read_ios": ios + 10 * max(1024, ios)})
        # writes left out: as many write I/Os as the slack allows, not one more
        assert TelemetryWindow.model_validate({**window, "operations": [read], "write_ios": 1024})
        with pytest.raises(ValidationError, match="write latency counts 0 I/Os"):
            TelemetryWindow.model_validate({**window, "operations": [read], "write_ios": 1025})

    @pytest.mark.parametrize("text", ["12", "\x00", "1\x00"])
    @pytest.mark.parametrize("histogram", ["device_ns", "size_bytes", "queue_ns"])
    def test_a_histogram_holds_numbers_only(self, histogram: str, text: str) -> None:
        """The NUL walk passes histograms by (their share of a window's values made it most
        of the agent's CPU validating its own windows): safe only because no text, NUL or
        not, is taken for a number in them."""
        window = ebpf_window()
        operation = window["operations"][0]
        pairs = operation.get(histogram) or [(12, operation["count"])]
        valid = dict(operation)
        for pair in ((text, pairs[0][1]), (pairs[0][0], text)):
            operation[histogram] = [pair, *pairs[1:]]
            # alone (as the agent makes them): validation itself refuses the text
            with pytest.raises(ValidationError, match="valid integer"):
                OperationLatency.model_validate(operation)
            # inside a window given as data, the window's own walk may see the NUL first
            with pytest.raises(ValidationError, match=r"valid integer|NUL"):
                TelemetryWindow.model_validate(window)
        assert OperationLatency.model_validate(valid)

    def test_nul_in_text_beside_the_histograms_is_still_refused(self) -> None:
        window = ebpf_window(latency_note="read\x00")
        with pytest.raises(ValidationError, match="NUL"):
            TelemetryWindow.model_validate(window)


@given(
    st.dictionaries(
        st.integers(0, histograms.LATENCY_SLOTS - 1),
        st.integers(1, 10**12) | st.integers(1, 3),
        max_size=60,
    )
)
def test_percentiles_in_one_walk_are_each_quantile(counts: dict[int, int]) -> None:
    """percentiles_us walks the slots once for all four; each must be exactly `quantile`'s."""
    histogram = sorted(counts.items())
    expected = {
        name: value / 1000
        for name, q in histograms.PERCENTILES.items()
        if (value := histograms.quantile(histogram, q)) is not None
    }
    assert histograms.percentiles_us(histogram) == expected


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
