"""ONNX Runtime latency of several model files, measured interleaved.

On a shared machine the load drifts from second to second; timing model A for a while,
then model B, would compare the machine at two moments. Rounds alternate the models, each
round's p50 is taken per model, and the median of those is reported; p99 comes from all
of a model's runs pooled.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from turboinfer.bench.latency import time_runs
from turboinfer.bench.stats import summarize_ns
from turboinfer.engines import EngineSettings, ModelArtifact, load_session
from turboinfer.errors import ConfigError


@dataclass(frozen=True)
class LatencySettings:
    batch_size: int = 1
    rounds: int = 5
    seconds_per_round: float = 0.4
    min_runs_per_round: int = 10
    engine: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.rounds < 1 or self.min_runs_per_round < 1:
            raise ConfigError("latency batch size, rounds and runs must be >= 1")


@dataclass(frozen=True)
class Latency:
    p50_ms: float  # median over rounds of each round's p50
    p99_ms: float  # over every run pooled
    runs: int

    def to_dict(self) -> dict[str, float]:
        return {"p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "runs": self.runs}


def onnx_latency(
    models: Mapping[str, Path], feeds: Mapping[str, np.ndarray], settings: LatencySettings
) -> dict[str, Latency]:
    """Latency per model label, all models fed the same ``feeds``."""
    sessions = {
        label: load_session(ModelArtifact(label, path), "onnxruntime", settings.engine)
        for label, path in models.items()
    }
    for session in sessions.values():
        session.run(feeds)  # warm the allocator and fail on bad feeds before any timing
    round_p50: dict[str, list[float]] = {label: [] for label in sessions}
    pooled: dict[str, list[int]] = {label: [] for label in sessions}
    for _ in range(settings.rounds):
        for label, session in sessions.items():
            durations = time_runs(session.run, feeds, min_runs=settings.min_runs_per_round,
                                  min_seconds=settings.seconds_per_round, warmup_runs=2)
            round_p50[label].append(summarize_ns(durations).p50_ms)
            pooled[label].extend(durations)
    return {
        label: Latency(statistics.median(round_p50[label]), summarize_ns(pooled[label]).p99_ms,
                       len(pooled[label]))
        for label in sessions
    }
