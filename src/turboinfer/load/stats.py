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
    count = int(histogram.get_total_count())
    if count == 0:
        return LatencySummary(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    values = histogram.get_percentile_to_value_dict(list(PERCENTILES))
    p50, p90, p95, p99, p999 = (values[p] / 1000 for p in PERCENTILES)
    return LatencySummary(
        count=count,
        mean_ms=histogram.get_mean_value() / 1000,
        p50_ms=p50, p90_ms=p90, p95_ms=p95, p99_ms=p99, p999_ms=p999,
        max_ms=histogram.get_max_value() / 1000,
    )


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
