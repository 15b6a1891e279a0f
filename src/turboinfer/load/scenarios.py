"""The scenarios: which load points to measure, and for how long.

``single`` (MLPerf SingleStream), ``concurrency`` (perf_analyzer's closed-loop sweep,
each level repeated until stable), ``poisson`` (open loop, MLPerf Server arrivals),
``maxrate`` (the highest Poisson rate within a p99 bound) and ``soak`` (a long steady
rate judged for drift). Each appends its runs to the report as they finish.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from turboinfer.errors import ConfigError
from turboinfer.load.client import InferClient, ServerError
from turboinfer.load.inputs import ModelInfo
from turboinfer.load.metrics import MetricsSource, ServerSide, Snapshot, server_side
from turboinfer.load.results import LoadReport, RunResult
from turboinfer.load.runner import (
    LoopResult,
    LoopSettings,
    Progress,
    Requests,
    StopRule,
    WindowHook,
    closed_loop,
    open_loop,
)
from turboinfer.load.stats import (
    Recorder,
    cdf_points,
    corrected_histogram,
    merge,
    summarize,
    window_stats,
)
from turboinfer.load.verdicts import (
    client_warnings,
    error_warning,
    omission_warning,
    stability_rule,
)


class Scenario(enum.Enum):
    SINGLE = "single"
    CONCURRENCY = "concurrency"
    POISSON = "poisson"
    MAXRATE = "maxrate"
    SOAK = "soak"


@dataclass(frozen=True)
class ScenarioSettings:
    """Every knob of every scenario, validated once; each scenario reads its own."""

    scenario: Scenario = Scenario.SINGLE
    duration_s: float = 10.0
    concurrency: tuple[int, ...] = (1, 4, 16, 64)
    rate: float = 0.0
    p99_ms: float = 0.0
    window_s: float = 1.0
    max_windows: int = 10
    stable_windows: int = 3
    stability: float = 0.10
    trial_s: float = 5.0
    max_trials: int = 10
    search_tolerance: float = 0.05
    probe_concurrency: int = 16
    max_error_rate: float = 0.01
    warmup_s: float = 1.0
    max_requests: int = 0
    timeout_s: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        needs = {Scenario.POISSON: ("rate", self.rate), Scenario.SOAK: ("rate", self.rate),
                 Scenario.MAXRATE: ("p99-ms", self.p99_ms)}
        if self.scenario in needs:
            flag, value = needs[self.scenario]
            if value <= 0:
                raise ConfigError(f"--scenario {self.scenario.value} needs --{flag} > 0")
        if self.duration_s <= 0 or self.window_s <= 0 or self.trial_s <= 0:
            raise ConfigError("durations and windows must be positive")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError("--concurrency needs levels >= 1, e.g. 1,4,16")
        if self.stable_windows < 1 or self.max_windows < self.stable_windows:
            raise ConfigError("--max-windows must be at least the stable window count")


@dataclass
class Context:
    """What every scenario works with; the report collects what they find."""

    client: InferClient
    request: Requests
    info: ModelInfo
    settings: ScenarioSettings
    report: LoadReport
    metrics: MetricsSource | None = None
    progress: Progress | None = None
    memory_series: list[tuple[float, float]] = field(default_factory=list)

    def loop_settings(self, duration_s: float, *, warmup: bool = True) -> LoopSettings:
        s = self.settings
        return LoopSettings(duration_s=duration_s, window_s=min(s.window_s, duration_s),
                            max_requests=s.max_requests,
                            warmup_s=s.warmup_s if warmup else 0.0, drain_s=s.timeout_s)


async def closed_run(ctx: Context, concurrency: int, duration_s: float, *,
                     stop_rule: StopRule | None = None, label: str = "") -> RunResult:
    """A closed loop at ``concurrency``; with a stop rule, judged on its last windows."""
    label = label or f"concurrency {concurrency}"
    before = await _snapshot(ctx)
    loop = await closed_loop(ctx.client, ctx.request, concurrency=concurrency,
                             settings=ctx.loop_settings(duration_s), stop_rule=stop_rule,
                             progress=ctx.progress, label=label)
    counted, stable = loop.windows, None
    if stop_rule is not None and not loop.aborted:
        # perf_analyzer reports the windows that agreed, not the warm-up before them.
        counted, stable = loop.windows[-ctx.settings.stable_windows:], stop_rule(loop.windows)
    return await _finish(ctx, label, loop, counted, before, concurrency=concurrency,
                         stable=stable)


async def open_run(ctx: Context, rate: float, duration_s: float, *,
                   on_window: WindowHook | None = None, warmup: bool = True) -> RunResult:
    label = f"rate {rate:g}/s"
    before = await _snapshot(ctx)
    loop = await open_loop(ctx.client, ctx.request, rate=rate,
                           settings=ctx.loop_settings(duration_s, warmup=warmup),
                           seed=ctx.settings.seed, progress=ctx.progress, label=label,
                           on_window=on_window)
    return await _finish(ctx, label, loop, loop.windows, before, rate=rate)


async def _finish(ctx: Context, label: str, loop: LoopResult, counted: list[Recorder],
                  before: Snapshot | None, *, concurrency: int | None = None,
                  rate: float | None = None, stable: bool | None = None) -> RunResult:
    """Summarize a loop into a result, append it to the report, stop if the server failed."""
    total = merge(counted)
    summary = summarize(total.histogram)
    lag_p99 = summarize(loop.send_lag.histogram).p99_ms if loop.send_lag else None
    corrected = None
    if concurrency is not None and summary.count:
        # A closed-loop sender's expected interval is one typical service time.
        expected_us = int(summary.p50_ms * 1000)
        corrected = summarize(corrected_histogram(total.histogram, expected_us)).p99_ms
    details = ctx.client.error_details()
    result = RunResult(
        label=label, mode="closed" if concurrency is not None else "open",
        concurrency=concurrency, target_rate=rate, duration_s=total.duration_s,
        ok=total.ok, failed=total.failed, errors=dict(total.errors),
        qps=total.ok / max(total.duration_s, 1e-9), latency=summary,
        windows=tuple(window_stats(w, loop.origin_ns) for w in loop.windows),
        cdf=tuple(cdf_points(total.histogram)), stable=stable, client_cpu=loop.client_cpu,
        send_lag_p99_ms=lag_p99, corrected_p99_ms=corrected,
        server=await _server_side(ctx, before), aborted=loop.aborted,
    )
    result = replace(result, warnings=_warnings(result, details))
    ctx.report.runs.append(result)
    ctx.report.errors_detail.update(details)
    if loop.aborted:
        raise ServerError(f"{label}: {loop.aborted}")
    return result


def _warnings(run: RunResult, details: dict[str, str]) -> tuple[str, ...]:
    found = client_warnings(run.label, run.client_cpu, run.send_lag_p99_ms)
    if run.corrected_p99_ms is not None:
        found.append(omission_warning(run.label, run.latency.p99_ms, run.corrected_p99_ms,
                                      run.latency.max_ms) or "")
    found.append(error_warning(run.label, run.errors, run.ok + run.failed, details) or "")
    if run.aborted:
        found.append(f"{run.label}: stopped early: {run.aborted}")
    return tuple(w for w in found if w)


async def _snapshot(ctx: Context) -> Snapshot | None:
    return await ctx.metrics.snapshot() if ctx.metrics is not None else None


async def _server_side(ctx: Context, before: Snapshot | None) -> ServerSide | None:
    after = await _snapshot(ctx)
    if before is None or after is None:
        return None
    return server_side(before, after, model=ctx.info.name,
                       max_batch_size=ctx.info.max_batch_size)


async def run_single(ctx: Context) -> None:
    await closed_run(ctx, 1, ctx.settings.duration_s, label="single")


async def run_concurrency(ctx: Context) -> None:
    s = ctx.settings
    rule = stability_rule(count=s.stable_windows, tolerance=s.stability)
    for level in s.concurrency:
        await closed_run(ctx, level, s.window_s * s.max_windows, stop_rule=rule)


async def run_poisson(ctx: Context) -> None:
    await open_run(ctx, ctx.settings.rate, ctx.settings.duration_s)
