"""Judging a variant: its metric on the evaluation set, its latency at batch 1, and
whether it stays within the accuracy budget of the FP32 reference.

Both go through the engines' protocol, so a variant is measured exactly as it will be
served; the timing loop is the benchmark's own. Every variant, built or searched, is
judged here, the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from turboinfer.bench.inputs import random_feeds
from turboinfer.bench.latency import time_session
from turboinfer.bench.stats import LatencyStats, summarize_ns
from turboinfer.engines import EngineSettings, ModelArtifact, Session, load_session
from turboinfer.errors import TurboinferError
from turboinfer.models.zoo import EvalSet, ZooEntry
from turboinfer.optimize.judge.evaluation import Evaluator, zoo_evaluator
from turboinfer.optimize.report import Built, VariantResult
from turboinfer.optimize.settings import AccuracyBudget, MeasureSettings, Variant

# How ORT and OpenVINO name the node an error is about.
_NODE = re.compile(r"node(?: with name)? '?([^'\s:]+)'?", re.IGNORECASE)


@dataclass(frozen=True)
class Judge:
    """What every variant is judged on, built once per model. ``evaluator`` is the
    metric bound to its data; without one, a zoo entry's metric on ``evalset`` is used."""

    entry: ZooEntry | None  # the built-in model, when it is one
    evalset: EvalSet | None
    feeds: Mapping[str, np.ndarray] | None  # batch-1 inputs; None: random from the specs
    settings: MeasureSettings
    evaluator: Evaluator | None = None

    @property
    def scorer(self) -> Evaluator | None:
        """The metric variants are scored on; None: accuracy is not compared."""
        if self.evaluator is not None:
            return self.evaluator
        if self.entry is not None and self.evalset is not None:
            return zoo_evaluator(self.entry, self.evalset)
        return None

    @property
    def has_metric(self) -> bool:
        return self.scorer is not None

    @property
    def higher_is_better(self) -> bool:
        scorer = self.scorer
        return scorer is None or scorer.higher_is_better


def open_session(path: Path, engine: str = "onnxruntime",
                 settings: EngineSettings | None = None) -> Session:
    return load_session(ModelArtifact(path.stem, path), engine, settings or EngineSettings())


def metric_of(path: Path, judge: Judge, engine: str = "onnxruntime") -> float | None:
    scorer = judge.scorer
    if scorer is None:
        return None
    session = open_session(path, engine)
    return float(scorer.compute(session.run))


def batch1_feeds(session: Session, judge: Judge) -> Mapping[str, np.ndarray]:
    return judge.feeds if judge.feeds is not None else random_feeds(session.inputs, 1)


def latency_of(path: Path, judge: Judge, engine_settings: EngineSettings | None = None
               ) -> LatencyStats:
    """p50/p99 at batch 1 on the judge's engine with default (or given) settings."""
    session = open_session(path, judge.settings.engine, engine_settings)
    feeds = batch1_feeds(session, judge)
    durations = time_session(session, feeds, min_runs=judge.settings.min_runs,
                             min_seconds=judge.settings.min_seconds,
                             warmup_runs=judge.settings.warmup_runs)
    return summarize_ns(durations)


def interleaved_p50(paths: Mapping[str, Path], judge: Judge, rounds: int = 3
                    ) -> dict[str, float]:
    """Median p50 per path over rounds that alternate between them.

    On a shared machine a background burst hits one measurement; alternating spreads it
    over all candidates, so a comparison between two files is fair.
    """
    sessions = {key: open_session(path, judge.settings.engine) for key, path in paths.items()}
    feeds = {key: batch1_feeds(s, judge) for key, s in sessions.items()}
    samples: dict[str, list[float]] = {key: [] for key in paths}
    for _ in range(rounds):
        for key, session in sessions.items():
            durations = time_session(session, feeds[key],
                                     min_runs=judge.settings.min_runs,
                                     min_seconds=judge.settings.min_seconds / rounds,
                                     warmup_runs=judge.settings.warmup_runs)
            samples[key].append(summarize_ns(durations).p50_ms)
    return {key: float(np.median(values)) for key, values in samples.items()}


def judge_reference(path: Path, judge: Judge, *, budget: AccuracyBudget | None
                    ) -> VariantResult:
    """The FP32 model's result, which every other variant is compared with."""
    metric = metric_of(path, judge)
    return VariantResult("fp32", Variant.FP32, path, file_size(path), metric,
                         0.0 if metric is not None else None,
                         True if budget is not None and metric is not None else None,
                         latency_of(path, judge))


def judge_built(built: Built, judge: Judge, *, reference: VariantResult,
                budget: AccuracyBudget | None) -> VariantResult:
    """A built variant's metric, delta to ``reference``, budget verdict and latency."""
    if built.path is None:
        return VariantResult(built.name, built.variant, skipped=built.skipped,
                             calibration=built.calibration, details=built.details)
    try:
        metric = metric_of(built.path, judge)
        latency = latency_of(built.path, judge)
    except (TurboinferError, RuntimeError) as exc:  # ORT and OpenVINO raise RuntimeErrors
        return VariantResult(built.name, built.variant, skipped=engine_failure(exc),
                             calibration=built.calibration, details=built.details)
    delta = within = None
    if metric is not None and reference.metric is not None:
        delta = metric - reference.metric
        if budget is not None:
            within = budget.meets(reference.metric, metric, judge.higher_is_better)
    return VariantResult(built.name, built.variant, built.path, file_size(built.path), metric,
                         delta, within, latency,
                         calibration=built.calibration, details=built.details)


def failure_line(exc: BaseException) -> str:
    """An exception's message on one line, naming the graph node when the engine does."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    node = _NODE.search(str(exc))
    if node and node.group(1) not in text:
        text += f" (node {node.group(1)!r})"
    return text if len(text) <= 300 else text[:297] + "..."


def engine_failure(exc: BaseException) -> str:
    return (f"engine error: {failure_line(exc)}; try another engine (--engines) or leave "
            "this variant out (--variants)")


def file_size(path: Path) -> int:
    """Bytes of an ONNX file and of its external data, when it has any."""
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)
