"""Judgements over measured numbers: stable or not, trustworthy or not, drifting or not."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from turboinfer.load.runner import StopRule
from turboinfer.load.stats import Recorder, summarize

# A closed loop's p99 is suspect when correcting for coordinated omission moves it this much.
OMISSION_FACTOR = 2.0
# Above this share of one core the client, not the server, may set the pace.
CLIENT_CPU_SATURATED = 0.9
# An open loop that sends this late (p99) is no longer keeping its schedule.
SEND_LAG_MS = 5.0
SOAK_P99_DRIFT = 1.5
SOAK_MEMORY_DRIFT = 0.10


def is_stable(windows: Sequence[Recorder], *, count: int, tolerance: float) -> bool:
    """perf_analyzer's rule: the last ``count`` windows each within ``tolerance`` of their
    mean, on throughput and on p99 alike."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    qps = [w.ok / max(w.duration_s, 1e-9) for w in last]
    p99 = [summarize(w.histogram).p99_ms for w in last]
    return _within(qps, tolerance) and _within(p99, tolerance)


def _within(values: Sequence[float], tolerance: float) -> bool:
    mean = statistics.fmean(values)
    if mean <= 0:
        return False
    return all(abs(v - mean) <= tolerance * mean for v in values)


def stability_rule(*, count: int, tolerance: float) -> StopRule:
    return lambda windows: is_stable(windows, count=count, tolerance=tolerance)


def omission_warning(label: str, p99_ms: float, corrected_p99_ms: float,
                     max_ms: float) -> str | None:
    """A closed loop measures from the actual send, so a stall delays only the requests
    already in flight and the p99 stays low; say so when the correction disagrees."""
    if corrected_p99_ms <= OMISSION_FACTOR * p99_ms:
        return None
    return (f"{label}: closed-loop latency hides a stall (coordinated omission): "
            f"max {max_ms:.1f} ms, p99 {p99_ms:.2f} ms, but {corrected_p99_ms:.1f} ms once "
            f"corrected for the sends the stall held back; use --scenario poisson "
            f"for the latency users would see")


def client_warnings(label: str, cpu: float, send_lag_p99_ms: float | None) -> list[str]:
    found = []
    if cpu >= CLIENT_CPU_SATURATED:
        found.append(f"{label}: the load generator used {cpu:.0%} of a core; the numbers "
                     f"may show the client's limit, not the server's")
    if send_lag_p99_ms is not None and send_lag_p99_ms > SEND_LAG_MS:
        found.append(f"{label}: requests left {send_lag_p99_ms:.1f} ms late (p99) against "
                     f"their schedule; the client is not keeping the rate")
    return found


def error_warning(label: str, errors: Mapping[str, int], total: int,
                  details: Mapping[str, str]) -> str | None:
    if not errors:
        return None
    parts = []
    for kind, count in sorted(errors.items(), key=lambda kv: -kv[1]):
        detail = details.get(kind, "")
        parts.append(f"{kind} x{count}" + (f" ({detail})" if detail else ""))
    failed = sum(errors.values())
    return f"{label}: {failed} of {total} requests failed: " + "; ".join(parts)


def p99_drift(window_p99_ms: Sequence[float]) -> tuple[float, float, float]:
    """(first, last, last/first): medians of the first and last thirds of the windows.

    The first window is left out when there are enough: it holds warm-up.
    """
    values = list(window_p99_ms[1:] if len(window_p99_ms) >= 4 else window_p99_ms)
    third = max(len(values) // 3, 1)
    first = statistics.median(values[:third])
    last = statistics.median(values[-third:])
    return first, last, (last / first if first > 0 else 1.0)


def memory_trend(series: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(relative growth, slope in MB per minute) of (seconds, MB) samples."""
    seconds = np.array([t for t, _ in series], dtype=np.float64)
    megabytes = np.array([m for _, m in series], dtype=np.float64)
    growth = (megabytes[-1] - megabytes[0]) / megabytes[0] if megabytes[0] > 0 else 0.0
    if len(series) < 2 or np.ptp(seconds) == 0:
        return float(growth), 0.0
    slope = float(np.polyfit(seconds, megabytes, 1)[0]) * 60.0
    return float(growth), slope
