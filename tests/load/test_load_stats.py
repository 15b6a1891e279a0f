from itertools import pairwise

import numpy as np
import pytest

from turboinfer.load.stats import (
    Recorder,
    cdf_points,
    corrected_histogram,
    merge,
    summarize,
    window_stats,
)


def _recorder(values_ms: list[float]) -> Recorder:
    rec = Recorder(0)
    for ms in values_ms:
        rec.record(int(ms * 1e6))
    return rec.close(1_000_000_000)


def test_percentiles_agree_with_numpy_within_hdr_precision() -> None:
    values = np.random.default_rng(0).lognormal(0.0, 1.0, 20_000).tolist()
    summary = summarize(_recorder(values).histogram)
    assert summary.count == len(values)
    for got, q in ((summary.p50_ms, 50), (summary.p90_ms, 90), (summary.p99_ms, 99),
                   (summary.p999_ms, 99.9)):
        # 3 significant digits, plus one value of rank slack.
        assert got == pytest.approx(np.percentile(values, q), rel=0.01)
    assert summary.max_ms == pytest.approx(max(values), rel=1e-3)



@pytest.mark.parametrize("scale_us", [3, 900, 40_000, 7_000_000])
def test_summary_is_exactly_what_hdrh_itself_reports(scale_us: int) -> None:
    """The numpy summary (hdrh's pure-Python walk blocked the open loop) gives hdrh's
    own mean and percentiles, bucket rules included."""
    rec = Recorder(0)
    for us in np.random.default_rng(scale_us).exponential(scale_us, 3000).astype(int) + 1:
        rec.histogram.record_value(int(us))
    histogram = rec.histogram
    summary = summarize(histogram)
    expected = histogram.get_percentile_to_value_dict([50.0, 90.0, 95.0, 99.0, 99.9])
    assert [summary.p50_ms, summary.p90_ms, summary.p95_ms, summary.p99_ms,
            summary.p999_ms] == [expected[p] / 1000 for p in (50.0, 90.0, 95.0, 99.0, 99.9)]
    assert summary.mean_ms == pytest.approx(histogram.get_mean_value() / 1000, rel=1e-12)
    assert summary.max_ms == histogram.get_max_value() / 1000

def test_empty_summary_is_zero_not_an_error() -> None:
    assert summarize(Recorder().histogram).count == 0


def test_merge_adds_histograms_and_errors_and_spans_time() -> None:
    first, second = _recorder([1.0] * 10), Recorder(1_000_000_000)
    second.record(int(5e6))
    second.record_error("http_503")
    second.close(3_000_000_000)
    total = merge([first, second])
    assert total.ok == 11 and total.failed == 1 and total.errors["http_503"] == 1
    assert total.duration_s == pytest.approx(3.0)


def test_correction_restores_the_sends_a_stall_held_back() -> None:
    # 1000 requests of 1 ms and one 500 ms stall: a closed loop's p99 stays 1 ms.
    rec = _recorder([1.0] * 1000 + [500.0])
    raw = summarize(rec.histogram)
    corrected = summarize(corrected_histogram(rec.histogram, 1000))
    assert raw.p99_ms == pytest.approx(1.0, rel=0.01)
    assert corrected.count == pytest.approx(1500, abs=2)
    assert corrected.p99_ms > 400


def test_cdf_points_are_monotonic_and_end_at_max() -> None:
    rec = _recorder(np.linspace(1, 100, 1000).tolist())
    points = cdf_points(rec.histogram)
    assert points[-1][0] == pytest.approx(100.0)
    assert points[-1][1] == pytest.approx(100.0, rel=1e-2)
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in pairwise(points))


def test_window_stats_rate_and_offsets() -> None:
    rec = _recorder([2.0] * 500)
    stats = window_stats(rec, origin_ns=0)
    assert stats.qps == pytest.approx(500.0)
    assert stats.start_s == 0.0 and stats.p50_ms == pytest.approx(2.0, rel=1e-2)
