"""``maxrate``: the highest Poisson rate whose p99 stays within a bound (MLPerf Server).

A closed-loop probe finds the server's capacity; Poisson trials then bracket the answer
(doubling while trials pass, halving while they fail) and bisect the bracket until it is
within a tolerance or the trial budget is spent. The answer is the best passing rate.
"""

from __future__ import annotations

import math

from turboinfer.load.client import ServerError
from turboinfer.load.results import MaxRateResult, RunResult
from turboinfer.load.scenarios import Context, ScenarioSettings, closed_run, open_run

# Below this the search has nothing left to learn: the server fails at a trickle.
MIN_RATE = 1.0


def passes(run: RunResult, settings: ScenarioSettings) -> bool:
    return (not run.aborted and run.ok > 0 and run.latency.p99_ms <= settings.p99_ms
            and run.error_rate < settings.max_error_rate)


def next_rate(rate: float, low: float, high: float) -> float:
    """Double until a trial fails, then bisect between the best pass and the worst fail."""
    return rate * 2 if math.isinf(high) else (low + high) / 2


async def run_maxrate(ctx: Context) -> None:
    s = ctx.settings
    probe = await closed_run(ctx, s.probe_concurrency, s.trial_s,
                             label=f"capacity (concurrency {s.probe_concurrency})")
    if probe.qps <= 0:
        raise ServerError("the capacity probe completed no request")
    low, high, rate = 0.0, math.inf, probe.qps
    trials: list[tuple[float, bool]] = []
    for _ in range(s.max_trials):
        rate = _rounded(rate)
        ok = passes(await open_run(ctx, rate, s.trial_s), s)
        trials.append((rate, ok))
        low, high = (rate, high) if ok else (low, rate)
        if not math.isinf(high) and high - low <= s.search_tolerance * high:
            break
        rate = next_rate(rate, low, high)
        if rate < MIN_RATE:
            break
    ctx.report.maxrate = MaxRateResult(
        p99_bound_ms=s.p99_ms, max_error_rate=s.max_error_rate, capacity_qps=probe.qps,
        max_rate=low, trials=tuple(trials))
    if low == 0.0:
        ctx.report.warnings.append(
            f"no rate tried kept p99 within {s.p99_ms:g} ms with < {s.max_error_rate:.0%} "
            f"errors (lowest tried {min(r for r, _ in trials):g}/s)")


def _rounded(rate: float) -> float:
    """Three significant digits: labels stay readable and trials repeatable."""
    digits = max(0, 2 - math.floor(math.log10(max(rate, 1e-9))))
    return round(rate, digits)
