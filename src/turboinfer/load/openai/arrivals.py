"""When each request is sent: Poisson or gamma arrivals, or all at once.

As vLLM's ``benchmark_serving``: gaps are gamma-distributed with shape ``burstiness`` and
mean ``1 / rate`` (shape 1 is a Poisson process; below 1 burstier, above 1 more even),
and the cumulative times are rescaled so the last request goes out at exactly
``count / rate`` seconds, which keeps the offered load identical across seeds.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_times(count: int, rate: float, burstiness: float = 1.0, *,
                  seed: int = 0) -> np.ndarray:
    """Send times in seconds from the start of the run, non-decreasing; [count]."""
    if count < 1:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(count)
    if math.isinf(burstiness):
        gaps = np.full(count, 1.0 / rate)
    else:
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    times = np.cumsum(gaps)
    return times * ((count / rate) / times[-1])
