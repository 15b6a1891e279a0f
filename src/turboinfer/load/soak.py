"""``soak``: a steady Poisson rate for a long time, judged for drift.

Latency drift compares the p99 of the first and last thirds of the windows; memory
drift fits the server's resident memory (from its ``/metrics``) sampled at each window.
"""

from __future__ import annotations

import asyncio
import time

from turboinfer.load.metrics import MEMORY
from turboinfer.load.results import RunResult, SoakVerdict
from turboinfer.load.scenarios import Context, open_run
from turboinfer.load.stats import Recorder
from turboinfer.load.verdicts import SOAK_MEMORY_DRIFT, SOAK_P99_DRIFT, memory_trend, p99_drift

MIN_WINDOWS = 3


async def run_soak(ctx: Context) -> None:
    origin_ns = time.perf_counter_ns()
    series: list[tuple[float, float]] = []
    samples: list[asyncio.Task[None]] = []

    async def sample_memory(at_ns: int) -> None:
        snap = await ctx.metrics.snapshot() if ctx.metrics is not None else None
        memory = snap.total(MEMORY, ctx.info.name) if snap is not None else None
        if memory is not None:
            series.append(((at_ns - origin_ns) / 1e9, memory / 1e6))

    def on_window(window: Recorder) -> None:
        samples.append(asyncio.create_task(sample_memory(window.ended_ns)))

    await sample_memory(origin_ns)
    try:
        run = await open_run(ctx, ctx.settings.rate, ctx.settings.duration_s,
                             on_window=on_window)
    finally:
        await asyncio.gather(*samples)
    ctx.report.soak = soak_verdict(run, sorted(series))


def soak_verdict(run: RunResult, memory: list[tuple[float, float]]) -> SoakVerdict:
    p99s = [w.p99_ms for w in run.windows if w.ok]
    if len(p99s) < MIN_WINDOWS:
        return SoakVerdict("too short", 0.0, 0.0, 1.0, None, None, None, None,
                           (f"{len(p99s)} windows with answers; need {MIN_WINDOWS}",),
                           tuple(memory))
    first, last, ratio = p99_drift(p99s)
    reasons = []
    if ratio > SOAK_P99_DRIFT:
        reasons.append(f"p99 rose from {first:.2f} ms to {last:.2f} ms ({ratio:.2f}x)")
    growth = slope = None
    if len(memory) >= 2:
        growth, slope = memory_trend(memory)
        if growth > SOAK_MEMORY_DRIFT:
            reasons.append(f"server memory grew {growth:.0%} "
                           f"({memory[0][1]:.0f} -> {memory[-1][1]:.0f} MB, "
                           f"{slope:+.1f} MB/min)")
    return SoakVerdict(
        verdict="drift" if reasons else "stable",
        p99_first_ms=first, p99_last_ms=last, p99_ratio=ratio,
        memory_first_mb=memory[0][1] if memory else None,
        memory_last_mb=memory[-1][1] if memory else None,
        memory_growth=growth, memory_slope_mb_per_min=slope,
        reasons=tuple(reasons), memory_series=tuple(memory),
    )
