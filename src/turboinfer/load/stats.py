"""Latency and error statistics on HdrHistogram, in microseconds.

A recorder holds one measurement window: a histogram of successful latencies and error
counts by kind. Windows merge exactly (histograms add), so a run's summary is the sum
of its windows, and percentiles keep 3 significant digits from 1 µs to one hour.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000
SIGNIFICANT_DIGITS = 3
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


class Recorder:
    """Outcomes of one window. ``record`` is on the hot path: keep it a few operations."""

    def __init__(self, started_ns: int | None = None) -> None:
        self.histogram = new_histogram()
        self.errors: Counter[str] = Counter()
        self.started_ns = time.perf_counter_ns() if started_ns is None else started_ns
        self.ended_ns = self.started_ns

    def record(self, latency_ns: int) -> None:
        self.histogram.record_value(min(max(latency_ns // 1000, LOWEST_US), HIGHEST_US))

    def record_error(self, kind: str) -> None:
        self.errors[kind] += 1

    def close(self, ended_ns: int | None = None) -> Recorder:
        self.ended_ns = time.perf_counter_ns() if ended_ns is None else ended_ns
        return self

    @property
    def ok(self) -> int:
        return int(self.histogram.get_total_count())

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def duration_s(self) -> float:
        return (self.ended_ns - self.started_ns) / 1e9


def merge(recorders: list[Recorder]) -> Recorder:
    """One recorder spanning ``recorders`` (in time order)."""
    if not recorders:
        return Recorder().close()
    total = Recorder(recorders[0].started_ns)
    for rec in recorders:
        total.histogram.add(rec.histogram)
        total.errors.update(rec.errors)
    return total.close(recorders[-1].ended_ns)


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles of successful requests, in milliseconds."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(histogram: HdrHistogram) -> LatencySummary:
    """HdrHistogram's own mean and percentiles, computed over its counts array with numpy.

    The hdrh package walks its ~23,000 buckets in Python (its mean alone took 160 ms per
    call here); the open loop summarizes a window twice a second on its event loop, and
    that blocking made the sends late, which the open loop rightly counts as latency.
    """
    count = int(histogram.get_total_count())
    if count == 0:
        return LatencySummary(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    highest, median = _bucket_values(histogram)
    # Nothing lies above the largest recorded value's bucket.
    last = histogram._counts_index_for(histogram.max_value) + 1
    counts = np.ctypeslib.as_array(histogram.counts)[:last]
    cumulative = np.cumsum(counts, dtype=np.int64)
    targets = [max(int(p * count / 100 + 0.5), 1) for p in PERCENTILES]
    indexes = np.searchsorted(cumulative, targets)
    p50, p90, p95, p99, p999 = (int(highest[i]) / 1000 for i in indexes)
    return LatencySummary(
        count=count,
        mean_ms=float(np.dot(counts.astype(np.float64), median[:last])) / count / 1000,
        p50_ms=p50, p90_ms=p90, p95_ms=p95, p99_ms=p99, p999_ms=p999,
        max_ms=histogram.get_max_value() / 1000,
    )


_BUCKETS: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}


def _bucket_values(histogram: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """Per counts index: the highest and the median equivalent value (hdrh's rules)."""
    key = (histogram.counts_len, histogram.sub_bucket_half_count_magnitude,
           histogram.unit_magnitude)
    if key not in _BUCKETS:
        index = np.arange(histogram.counts_len, dtype=np.int64)
        half_magnitude, unit = key[1], key[2]
        half = 1 << half_magnitude
        bucket = (index >> half_magnitude) - 1
        sub = (index & (half - 1)) + half
        first = bucket < 0
        sub[first] -= half
        bucket[first] = 0
        lowest = sub << (bucket + unit)
        size = np.left_shift(1, bucket + unit)
        _BUCKETS[key] = (lowest + size - 1, (lowest + (size >> 1)).astype(np.float64))
    return _BUCKETS[key]


def corrected_histogram(histogram: HdrHistogram, expected_interval_us: int) -> HdrHistogram:
    """The histogram a closed loop would have recorded without coordinated omission.

    A closed loop stops sending while a request stalls, so the requests that users would
    have sent during the stall are never measured. HdrHistogram's correction adds them
    back: for a value ``v`` above the expected interval it also records ``v - k*interval``
    for every missed send, as wrk2 and Gil Tene's tools do.
    """
    corrected = new_histogram()
    interval = max(expected_interval_us, LOWEST_US)
    for item in histogram.get_recorded_iterator():
        corrected.record_corrected_value(item.value_iterated_to, interval,
                                         item.count_at_value_iterated_to)
    return corrected


def cdf_points(histogram: HdrHistogram, *, ticks_per_half: int = 5) -> list[tuple[float, float]]:
    """(percentile, latency ms) along HdrHistogram's percentile iterator, for plots."""
    if histogram.get_total_count() == 0:
        return []
    points = []
    for item in histogram.get_percentile_iterator(ticks_per_half):
        points.append((float(item.percentile_level_iterated_to),
                       item.value_iterated_to / 1000))
    return points


@dataclass(frozen=True)
class WindowStats:
    """One window of a run: when, how many, how fast, how slow."""

    start_s: float
    duration_s: float
    ok: int
    failed: int
    qps: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def window_stats(rec: Recorder, origin_ns: int) -> WindowStats:
    summary = summarize(rec.histogram)
    duration = max(rec.duration_s, 1e-9)
    return WindowStats(
        start_s=(rec.started_ns - origin_ns) / 1e9,
        duration_s=rec.duration_s,
        ok=rec.ok,
        failed=rec.failed,
        qps=rec.ok / duration,
        p50_ms=summary.p50_ms,
        p99_ms=summary.p99_ms,
        max_ms=summary.max_ms,
    )
