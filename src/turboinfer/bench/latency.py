"""The in-process benchmark: engines × batch sizes, timed until count and time suffice."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from turboinfer.bench.inputs import random_feeds
from turboinfer.bench.memory import PeakRss
from turboinfer.bench.stats import LatencyStats, summarize_ns
from turboinfer.engines import EngineSettings, Session, load_session
from turboinfer.errors import ConfigError
from turboinfer.models import ResolvedModel

RunFn = Callable[[Mapping[str, np.ndarray]], Any]


@dataclass(frozen=True)
class BenchConfig:
    engines: tuple[str, ...] = ("onnxruntime",)
    batch_sizes: tuple[int, ...] = (1,)
    settings: EngineSettings = field(default_factory=EngineSettings)
    min_runs: int = 20
    min_seconds: float = 1.0
    warmup_runs: int = 3
    # Input shapes for ONNX files whose non-batch axes are dynamic (name -> shape).
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.engines:
            raise ConfigError("at least one engine is needed")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError("batch sizes must be positive integers")
        if self.min_runs < 1 or self.min_seconds < 0 or self.warmup_runs < 0:
            raise ConfigError("min-runs must be >= 1, min-seconds and warm-up >= 0")


@dataclass(frozen=True)
class BenchResult:
    engine: str
    batch_size: int
    latency: LatencyStats
    qps: float  # samples per second: batch_size / mean latency
    peak_rss_mb: float

    def to_dict(self) -> dict[str, Any]:
        lat = self.latency
        return {
            "engine": self.engine,
            "batch_size": self.batch_size,
            "p50_ms": lat.p50_ms,
            "p90_ms": lat.p90_ms,
            "p95_ms": lat.p95_ms,
            "p99_ms": lat.p99_ms,
            "mean_ms": lat.mean_ms,
            "qps": self.qps,
            "peak_rss_mb": self.peak_rss_mb,
            "runs": lat.count,
        }


def time_runs(run: RunFn, feeds: Mapping[str, np.ndarray], *, min_runs: int,
              min_seconds: float, warmup_runs: int) -> list[int]:
    """Durations in ns of back-to-back runs, after warm-up. The loop is kept bare:
    one clock read between runs, appends through a bound method."""
    for _ in range(warmup_runs):
        run(feeds)
    clock = time.perf_counter_ns
    durations: list[int] = []
    append = durations.append
    deadline = clock() + int(min_seconds * 1e9)
    start = clock()
    while True:
        run(feeds)
        end = clock()
        append(end - start)
        if end >= deadline and len(durations) >= min_runs:
            return durations
        start = end


def feeds_for(model: ResolvedModel, session: Session, batch_size: int,
              input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    if model.entry is not None and not input_shapes:
        return model.entry.example_inputs(batch_size)
    return random_feeds(session.inputs, batch_size, shapes=dict(input_shapes))


def bench_session(engine: str, session: Session, model: ResolvedModel,
                  config: BenchConfig, batch_size: int) -> BenchResult:
    feeds = feeds_for(model, session, batch_size, config.input_shapes)
    session.run(feeds)  # fail fast on bad inputs, before the memory sampler starts
    with PeakRss() as memory:
        durations = time_runs(session.run, feeds, min_runs=config.min_runs,
                              min_seconds=config.min_seconds,
                              warmup_runs=config.warmup_runs)
    stats = summarize_ns(durations)
    return BenchResult(engine, batch_size, stats, batch_size * 1000.0 / stats.mean_ms,
                       memory.peak_mb)


def run_bench(model: ResolvedModel, config: BenchConfig,
              on_result: Callable[[BenchResult], None] | None = None) -> list[BenchResult]:
    """Every (engine, batch size) pair, engines loaded once each, in the order given."""
    results = []
    for engine in config.engines:
        session = load_session(model.artifact, engine, config.settings)
        for batch_size in config.batch_sizes:
            result = bench_session(engine, session, model, config, batch_size)
            results.append(result)
            if on_result is not None:
                on_result(result)
        del session
    return results
