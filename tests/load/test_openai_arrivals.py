"""Poisson and gamma arrival schedules, seeded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from turboinfer.load.openai.arrivals import arrival_times


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_times(5, math.inf).tolist() == [0.0] * 5


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a, b = arrival_times(50, 10.0, seed=3), arrival_times(50, 10.0, seed=3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, arrival_times(50, 10.0, seed=4))


def test_last_request_goes_out_at_count_over_rate() -> None:
    for burstiness in (0.5, 1.0, 4.0, math.inf):
        times = arrival_times(200, 20.0, burstiness, seed=1)
        assert times[-1] == pytest.approx(10.0)
        assert np.all(np.diff(times) >= 0) and times[0] > 0


def test_poisson_gaps_are_exponential() -> None:
    gaps = np.diff(arrival_times(20000, 5.0, 1.0, seed=0))
    assert gaps.mean() == pytest.approx(0.2, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # CV of an exponential


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_the_spread(burstiness: float) -> None:
    gaps = np.diff(arrival_times(20000, 5.0, burstiness, seed=0))
    # A gamma with shape k has coefficient of variation 1/sqrt(k).
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_infinite_burstiness_is_evenly_spaced() -> None:
    assert np.allclose(np.diff(arrival_times(10, 4.0, math.inf)), 0.25)
