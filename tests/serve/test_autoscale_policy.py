"""The scaling rules on their own: windows, bounds, hysteresis, the cap."""

from __future__ import annotations

from turboinfer.serve.config import AutoscalingConfig
from turboinfer.serve.scale_policy import HOLD, Sample, Window, cap, decide, window

CONFIG = AutoscalingConfig(enabled=True, min_instances=1, max_instances=4)


def test_window_needs_a_whole_window_of_samples() -> None:
    samples = [Sample(10.0, 0.0, 0), Sample(11.0, 0.8, 20), Sample(12.0, 1.6, 40)]
    assert window(samples[:2], 11.0, 2.0, 1) is None  # covers 1 s of the 2 asked
    measured = window(samples, 12.0, 2.0, 1)
    assert measured == Window(2.0, 0.8, 20.0)
    # Two instances share the busy seconds: each was busy 40% of the time.
    assert window(samples, 12.0, 2.0, 2) == Window(2.0, 0.4, 20.0)
    assert window([], 12.0, 1.0, 1) is None


def test_busy_instances_scale_up_until_the_cap_then_hold() -> None:
    busy = Window(5.0, 0.95, 200.0)
    up = decide(CONFIG, 1, 4, 3, busy, busy)
    assert up is not None and (up.count, up.direction, up.reason) == (2, "up", "cpu_utilization")
    assert "0.95 >= 0.70" in up.detail
    at_cap = decide(CONFIG, 4, 4, 0, busy, busy)
    assert at_cap is not None and at_cap.direction == HOLD and at_cap.count == 4
    no_core_left = decide(CONFIG, 2, 4, 0, busy, busy)
    assert no_core_left is not None and no_core_left.direction == HOLD


def test_a_busy_but_slow_model_is_never_scaled_down_into_overload() -> None:
    # 2 QPS is under the 5 QPS threshold, but the two instances are each 60% busy: one
    # alone would be 120% busy, so removing it would only make the next scale-up.
    slow = Window(30.0, 0.60, 2.0)
    assert decide(CONFIG, 2, 4, 2, slow, slow) is None
    # Within the band: one alone would be 64% busy, under the 70% threshold but above
    # 80% of it; measurements wobble, so it stays at two rather than risk flapping.
    assert decide(CONFIG, 2, 4, 2, Window(30.0, 0.32, 2.0), Window(30.0, 0.32, 2.0)) is None
    quiet = Window(30.0, 0.10, 2.0)
    down = decide(CONFIG, 2, 4, 2, quiet, quiet)
    assert down is not None and (down.count, down.direction, down.reason) == (1, "down",
                                                                               "low_rate")


def test_a_rate_above_the_threshold_never_scales_down() -> None:
    # Over-capacity load, once scaled: utilisation under the threshold and a high rate.
    settled = Window(30.0, 0.40, 150.0)
    assert decide(CONFIG, 3, 4, 1, settled, settled) is None


def test_bounds_apply_without_a_window() -> None:
    config = AutoscalingConfig(enabled=True, min_instances=2, max_instances=3)
    below = decide(config, 1, 3, 2, None, None)
    assert below is not None and (below.count, below.reason) == (2, "min_instances")
    above = decide(config, 5, 3, 0, None, None)
    assert above is not None and (above.count, above.reason) == (3, "max_instances")
    assert decide(config, 2, 3, 1, None, None) is None
    assert decide(config, 2, 3, 1, None, Window(1.0, 0.0, 0.0)) is None  # at the minimum


def test_cap_is_the_usable_cores_at_one_thread_or_the_fixed_count() -> None:
    unbounded = AutoscalingConfig(enabled=True)
    assert cap(unbounded, cores=2, fixed_threads=0) == 2
    assert cap(unbounded, cores=8, fixed_threads=2) == 4
    assert cap(AutoscalingConfig(enabled=True, max_instances=3), cores=8, fixed_threads=0) == 3
    assert cap(AutoscalingConfig(enabled=True, max_instances=6), cores=2, fixed_threads=0) == 2
    # The minimum is honoured even where the cores would not allow it.
    assert cap(AutoscalingConfig(enabled=True, min_instances=3), cores=2,
               fixed_threads=0) == 3
