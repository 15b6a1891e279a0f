"""Latency statistics. Percentiles use linear interpolation between closest ranks,
the same definition as ``numpy.percentile``'s default, so numbers compare across tools."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values."""
    if not sorted_values:
        raise ValueError("percentile of an empty sample")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    rank = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


@dataclass(frozen=True)
class LatencyStats:
    """Summary of one latency sample, in milliseconds."""

    count: int
    mean_ms: float
    min_ms: float
    max_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize_ns(durations_ns: Sequence[int]) -> LatencyStats:
    """Summarize durations measured with ``time.perf_counter_ns``."""
    values = sorted(d / 1e6 for d in durations_ns)
    if not values:
        raise ValueError("no durations to summarize")
    p50, p90, p95, p99 = (percentile(values, q) for q in PERCENTILES)
    return LatencyStats(
        count=len(values),
        mean_ms=math.fsum(values) / len(values),
        min_ms=values[0],
        max_ms=values[-1],
        p50_ms=p50,
        p90_ms=p90,
        p95_ms=p95,
        p99_ms=p99,
    )


@dataclass(frozen=True)
class Spread:
    """One quantity measured in several rounds: the median over rounds and a bootstrap
    confidence interval of that median (whole rounds resampled, so a background burst that
    hit one round counts as one draw, not as many samples)."""

    median: float
    low: float
    high: float
    rounds: int
    # The per-round values in round order, when known: two quantities timed in the same
    # interleaved rounds compare round by round (see ``clearly_above``).
    values: tuple[float, ...] = field(default=(), compare=False, repr=False)

    def clearly_above(self, other: Spread, floor: float = 0.0) -> bool:
        """Above ``other`` beyond the noise, by more than ``floor`` (a fraction of
        ``other``'s median).

        Timed in the same rounds (three or more), the two compare round by round: the
        median of the per-round ratios must pass ``1 + floor`` and the low end of its
        interval 1. A burst of background load slows every candidate of its round, so the
        ratio cancels most of what widens each interval alone; comparing intervals only,
        a loaded machine makes every candidate look alike. Otherwise: the intervals do not
        overlap and the medians differ by more than ``floor``.
        """
        paired = len(self.values) == len(other.values) >= 3
        if paired and all(v > 0 for v in other.values):
            ratios = spread([a / b for a, b in zip(self.values, other.values, strict=True)])
            return ratios.low > 1.0 and ratios.median > 1.0 + floor
        return (self.low > other.high
                and self.median - other.median > floor * abs(other.median))

    def to_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "low": self.low, "high": self.high,
                "rounds": self.rounds}


def spread(values: Sequence[float], *, confidence: float = 0.8, resamples: int = 1000,
           seed: int = 0) -> Spread:
    """Median of per-round ``values`` with its bootstrap ``confidence`` interval.

    80% by default: over five rounds that is the second to the fourth value, so one
    disturbed round on either side moves neither bound. The generator is seeded, so the
    same rounds always give the same interval.
    """
    if not values:
        raise ValueError("spread of no rounds")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    data = np.asarray(values, dtype=np.float64)
    median = float(np.median(data))
    rounds = tuple(float(v) for v in data)
    if len(data) == 1:
        return Spread(median, median, median, 1, rounds)
    rng = np.random.default_rng(seed)
    draws = data[rng.integers(0, len(data), size=(resamples, len(data)))]  # [resamples, rounds]
    medians = np.median(draws, axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return Spread(median, float(low), float(high), len(data), rounds)
