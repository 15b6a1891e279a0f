import pytest

from turboinfer.load.results import RunResult
from turboinfer.load.soak import soak_verdict
from turboinfer.load.stats import LatencySummary, Recorder, WindowStats
from turboinfer.load.verdicts import (
    client_warnings,
    error_warning,
    is_stable,
    memory_trend,
    omission_warning,
)


def _window(qps: float, latency_ms: float, seconds: float = 1.0) -> Recorder:
    rec = Recorder(0)
    for _ in range(int(qps * seconds)):
        rec.record(int(latency_ms * 1e6))
    return rec.close(int(seconds * 1e9))


def test_stability_needs_the_last_three_to_agree_on_rate_and_p99() -> None:
    settled = [_window(100, 9.0), _window(200, 2.0), _window(205, 2.0), _window(198, 2.05)]
    assert is_stable(settled, count=3, tolerance=0.10)
    assert not is_stable(settled[:3], count=3, tolerance=0.10)
    slow_tail = [*settled[:3], _window(200, 3.0)]
    assert not is_stable(slow_tail, count=3, tolerance=0.10)


def test_omission_warning_only_when_correction_moves_p99() -> None:
    assert omission_warning("c1", 1.0, 1.5, 3.0) is None
    text = omission_warning("c1", 1.0, 300.0, 500.0)
    assert text is not None and "coordinated omission" in text and "300.0 ms" in text


def test_client_and_error_warnings() -> None:
    assert client_warnings("x", 0.5, 1.0) == []
    assert len(client_warnings("x", 0.95, 20.0)) == 2
    text = error_warning("x", {"http_503": 3, "timeout": 1}, 100, {"http_503": "queue full"})
    assert text == "x: 4 of 100 requests failed: http_503 x3 (queue full); timeout x1"


def _soak_run(p99s: list[float]) -> RunResult:
    windows = tuple(WindowStats(float(i), 1.0, 100, 0, 100.0, 1.0, p, p) for i, p in
                    enumerate(p99s))
    return RunResult("rate 100/s", "open", None, 100.0, float(len(p99s)), 100 * len(p99s), 0,
                     {}, 100.0, LatencySummary(1, 1, 1, 1, 1, 1, 1, 1), windows, (), None, 0.1)


def test_soak_verdicts() -> None:
    flat = soak_verdict(_soak_run([5.0, 2.0, 2.1, 1.9, 2.0, 2.05, 2.0]),
                        [(0.0, 100.0), (3.0, 101.0), (6.0, 100.5)])
    assert flat.verdict == "stable" and flat.p99_ratio == pytest.approx(1.0, abs=0.1)
    rising = soak_verdict(_soak_run([2.0, 2.0, 2.1, 3.0, 4.0, 6.0, 8.0]), [])
    assert rising.verdict == "drift" and "p99 rose" in rising.reasons[0]
    leaking = soak_verdict(_soak_run([2.0] * 6), [(0.0, 100.0), (60.0, 130.0)])
    assert leaking.verdict == "drift" and "memory grew 30%" in leaking.reasons[0]
    assert soak_verdict(_soak_run([2.0]), []).verdict == "too short"


def test_memory_trend_slope_per_minute() -> None:
    growth, slope = memory_trend([(0.0, 100.0), (30.0, 105.0), (60.0, 110.0)])
    assert growth == pytest.approx(0.10) and slope == pytest.approx(10.0)
