"""The uncertainty-aware regressor: scikit-learn's contract, and an uncertainty that means
something (small where data is dense, large where it is absent)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression
from sklearn.utils.estimator_checks import check_estimator

from models.estimator import BootstrapRegressor


def test_follows_the_scikit_learn_estimator_contract() -> None:
    check_estimator(BootstrapRegressor(estimator=LinearRegression(), n_estimators=3))


def test_fits_and_is_unsure_away_from_its_data() -> None:
    rng = np.random.default_rng(7)
    x = rng.uniform(0, 1, size=(400, 1))
    y = 3 * x[:, 0] + rng.normal(0, 0.05, 400)
    model = BootstrapRegressor(estimator=LinearRegression(), n_estimators=24, random_state=1)
    model.fit(x, y)
    mean, std = model.predict(np.array([[0.5], [5.0]]), return_std=True)
    assert mean[0] == pytest.approx(1.5, abs=0.05)
    # 5.0 lies far outside the data: the members' extrapolations disagree much more
    assert std[1] > 5 * std[0]
    low, high = model.predict_interval(np.array([[0.5]]), coverage=0.8)
    assert low[0] < mean[0] < high[0]


def test_default_members_are_gradient_boosting_and_reproducible() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, size=(120, 3))
    y = x[:, 0] * 10 + (x[:, 1] > 0.5) * 5
    first = BootstrapRegressor(n_estimators=4, random_state=0).fit(x, y).predict(x)
    second = BootstrapRegressor(n_estimators=4, random_state=0).fit(x, y).predict(x)
    assert np.array_equal(first, second)
    assert np.corrcoef(first, y)[0, 1] > 0.95


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="n_estimators"):
        BootstrapRegressor(n_estimators=0).fit(np.ones((4, 1)), np.ones(4))
    model = BootstrapRegressor(estimator=LinearRegression(), n_estimators=2).fit(
        np.arange(8.0).reshape(-1, 1), np.arange(8.0)
    )
    with pytest.raises(ValueError, match="coverage"):
        model.predict_interval(np.ones((1, 1)), coverage=1.5)


def test_members_resample_whole_groups_and_say_which_they_left_out() -> None:
    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(30), 4)  # 30 cells of 4 repeats
    x = rng.uniform(0, 1, size=(120, 2))
    y = x[:, 0] + rng.normal(0, 0.01, 120)
    model = BootstrapRegressor(estimator=LinearRegression(), n_estimators=12, random_state=2)
    model.fit(x, y, groups=groups)
    assert model.in_bag_.shape == (12, 30)
    # about 1 - 1/e of the groups are in each member's bag, never all of them here
    assert 0.45 < model.in_bag_.mean() < 0.8
    oob = model.oob_members(x, groups)
    assert oob.shape == (12, 120)
    for member in range(12):
        for group in range(30):
            rows = oob[member, groups == group]
            # a group's repeats are in or out of a member together
            assert np.isnan(rows).all() == model.in_bag_[member, group]
            assert np.isnan(rows).any() == model.in_bag_[member, group]
    with pytest.raises(ValueError, match="groups"):
        model.oob_members(x, groups + 100)
    with pytest.raises(ValueError, match="one label per row"):
        model.fit(x, y, groups=groups[:10])
