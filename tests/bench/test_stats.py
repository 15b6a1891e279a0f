import numpy as np
import pytest

from turboinfer.bench.stats import percentile, summarize_ns


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 99.9, 100])
def test_percentile_agrees_with_numpy(n: int, q: float) -> None:
    values = sorted(np.random.default_rng(n).exponential(3.0, size=n).tolist())
    assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_ns_reports_milliseconds() -> None:
    durations = [1_000_000 * (i + 1) for i in range(100)]  # 1..100 ms
    stats = summarize_ns(durations)
    ms = np.arange(1, 101, dtype=float)
    assert stats.count == 100
    assert stats.min_ms == 1.0 and stats.max_ms == 100.0
    assert stats.mean_ms == pytest.approx(ms.mean())
    for q, value in [(50, stats.p50_ms), (90, stats.p90_ms), (95, stats.p95_ms),
                     (99, stats.p99_ms)]:
        assert value == pytest.approx(np.percentile(ms, q))
