"""Timing noise (`clock.py`): a method is called faster only beyond the run's own timing noise (hand-built
numbers)."""

from __future__ import annotations

import pytest

from pyramid_demo import clock
from pyramid_demo.core.trace import Step


def test_spread_is_the_interquartile_range_over_the_median():
    """Rule: the relative spread of repeated identical work is IQR ÷ median (numpy's interpolation)."""
    assert clock.relative_spread([1, 2, 3, 4]) == pytest.approx((3.25 - 1.75) / 2.5)  # quartiles interpolated
    assert clock.relative_spread([8, 9, 10, 11, 12]) == pytest.approx(0.2)
    assert clock.relative_spread([10, 10, 10, 10]) == 0.0
    assert clock.relative_spread([10]) is None


def test_noise_pools_large_groups_weighted_by_size():
    """Rule: the run's noise is the size-weighted mean spread of its same-k groups of at least MIN_GROUP
    forwards; smaller groups do not count, and none large enough gives None."""
    groups = {("target", 1): [8, 9, 10, 11, 12], ("target", 5): [20] * 5, ("draft", 1): [1, 100]}
    assert clock.timing_noise(groups) == pytest.approx(0.1)
    assert clock.timing_noise({("draft", 1): [1, 100]}) is None


def test_only_steps_with_one_forward_of_a_role_count():
    """Rule: a step's recorded time counts as one forward's only where that role made exactly one."""
    step = Step(
        0,
        [],
        None,
        [1],
        ["target"],
        0.0,
        0.03,
        time_s={"target": 0.02, "draft": 0.006},
        n_forward={"target": 1, "draft": 3},
        fed={"target": [5], "draft": [1, 1, 1]},
    )
    assert clock.same_k_forwards([step, step]) == {("target", 5): [0.02, 0.02]}


def test_a_margin_within_noise_is_a_tie():
    """Rule: a is faster than b only when a > b·(1 + noise); SD at 1.15× AR with 20% noise is a tie,
    at 1.32× it wins; the leaders are the fastest and everything within noise of it."""
    assert clock.compare(1.15, 1.0, 0.2) == 0
    assert clock.compare(1.32, 1.0, 0.2) == 1 and clock.compare(1.0, 1.32, 0.2) == -1
    speeds = {"ar": 10.0, "sd": 11.5, "fsd": 8.0}
    assert clock.leaders(speeds, 0.2) == ["sd", "ar"]
    assert clock.leaders(speeds, 0.1) == ["sd"]
    assert clock.leaders({}, 0.1) == []
