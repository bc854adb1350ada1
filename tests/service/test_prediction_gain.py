"""A prediction's gain is the improvement whatever the metric's direction: the dashboard ranks
and colours recommendations by it (a latency 38 % lower is a gain of +38 %, not -38 %)."""

from __future__ import annotations

import pytest

from service.recommendations.schemas import Prediction


def _prediction(change: float, low: float, high: float, *, higher: bool) -> Prediction:
    return Prediction(
        metric="m",
        current=1.0,
        recommended=1.0 + change,
        change=change,
        change_low=low,
        change_high=high,
        higher_is_better=higher,
    )


def test_lower_latency_is_a_positive_gain_with_its_interval_turned_round() -> None:
    latency = _prediction(-0.386, -0.45, -0.30, higher=False)
    assert (latency.gain, latency.gain_low, latency.gain_high) == pytest.approx((0.386, 0.30, 0.45))
    assert latency.gain_low <= latency.gain <= latency.gain_high


def test_more_iops_is_a_positive_gain_as_it_stands() -> None:
    iops = _prediction(0.65, 0.5, 0.8, higher=True)
    assert (iops.gain, iops.gain_low, iops.gain_high) == (0.65, 0.5, 0.8)


def test_the_api_carries_the_gain() -> None:
    dumped = _prediction(0.1, 0.05, 0.2, higher=False).model_dump()
    assert dumped["gain"] == pytest.approx(-0.1)
    assert (dumped["gain_low"], dumped["gain_high"]) == pytest.approx((-0.2, -0.05))
