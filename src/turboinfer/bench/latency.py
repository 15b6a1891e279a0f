"""Timing one engine session at one batch size, until both run count and time suffice."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from turboinfer.bench.inputs import random_feeds
from turboinfer.bench.memory import PeakRss
from turboinfer.bench.stats import LatencyStats, summarize_ns
from turboinfer.engines import ENGINES, EngineSettings, Session
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
    # (name, shape without the batch axis) for inputs with dynamic axes; see shapes.py.
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        if not self.engines:
            raise ConfigError("at least one engine is needed")
        unknown = [name for name in self.engines if name not in ENGINES]
        if unknown:
            # A typo is the user's to fix, unlike an engine that cannot run the model.
            raise ConfigError(f"unknown engine {unknown[0]!r}; known: {', '.join(ENGINES)}")
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


def time_session(session: Session, feeds: Mapping[str, np.ndarray], *, min_runs: int,
                 min_seconds: float, warmup_runs: int) -> list[int]:
    """``time_runs`` on the session's own clock: CUDA events on its stream for a session
    that runs on a GPU stream (``cuda_stream``), the host's perf counter otherwise. Every
    timing of a session (bench, optimize, tune) goes through here, so a device's clock
    changes in one place."""
    stream = getattr(session, "cuda_stream", None)
    if stream is None:
        return time_runs(session.run, feeds, min_runs=min_runs, min_seconds=min_seconds,
                         warmup_runs=warmup_runs)
    from turboinfer.bench.cuda_clock import time_runs_cuda  # torch: only for a GPU session

    return time_runs_cuda(session.run, feeds, stream, min_runs=min_runs,
                          min_seconds=min_seconds, warmup_runs=warmup_runs)


def feeds_for(model: ResolvedModel, session: Session, batch_size: int,
              input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    if model.entry is not None and not input_shapes:
        return model.entry.example_inputs(batch_size)
    return random_feeds(session.inputs, batch_size, shapes=dict(input_shapes))


def bench_session(engine: str, session: Session, model: ResolvedModel,
                  config: BenchConfig, batch_size: int) -> BenchResult:
    feeds = feeds_for(model, session, batch_size, dict(config.input_shapes))
    session.run(feeds)  # fail fast on bad inputs, before the memory sampler starts
    return measure(engine, session, feeds, batch_size, config)


def measure(engine: str, session: Session, feeds: Mapping[str, np.ndarray], batch_size: int,
            config: BenchConfig) -> BenchResult:
    """Time ``session`` on ``feeds`` (already known to run) with its peak memory."""
    with PeakRss() as memory:
        durations = time_session(session, feeds, min_runs=config.min_runs,
                                 min_seconds=config.min_seconds,
                                 warmup_runs=config.warmup_runs)
    stats = summarize_ns(durations)
    return BenchResult(engine, batch_size, stats, batch_size * 1000.0 / stats.mean_ms,
                       memory.peak_mb)
