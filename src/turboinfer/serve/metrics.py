"""Prometheus metrics and Triton-style statistics, fed by the same hot-path calls.

Metric names follow Triton's semantics with a ``turboinfer_`` prefix and base units
(seconds, not microseconds). ``inference_total / execution_total`` is the average batch
size. Each server owns its registry, so several servers in one process never collide.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from turboinfer.serve.batcher import BatchObserver

PREFIX = "turboinfer"
LABELS = ("model", "version")
# Latency buckets from 100 µs to 10 s: CPU inference of small models lives below 1 ms.
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The metric families of one server."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(namespace=PREFIX, registry=self.registry)
        r = self.registry
        self.success = Counter(f"{PREFIX}_request_success", "Successful inference requests",
                               LABELS, registry=r)
        self.failure = Counter(f"{PREFIX}_request_failure", "Failed inference requests",
                               (*LABELS, "reason"), registry=r)
        self.inferences = Counter(f"{PREFIX}_inference", "Inferences (rows) performed",
                                  LABELS, registry=r)
        self.executions = Counter(f"{PREFIX}_execution", "Batches executed", LABELS,
                                  registry=r)
        self.request_time = self._histogram("request_duration_seconds",
                                            "End-to-end request time in the server")
        self.queue_time = self._histogram("queue_duration_seconds", "Time spent queued")
        self.compute_time = self._histogram("compute_duration_seconds",
                                            "Batch compute time (input, infer, output)")
        self.batch_size = Histogram(f"{PREFIX}_batch_size", "Rows per executed batch",
                                    LABELS, buckets=BATCH_BUCKETS, registry=r)
        self.pending = Gauge(f"{PREFIX}_pending_requests", "Requests waiting in queues",
                             LABELS, registry=r)
        self.loaded = Gauge(f"{PREFIX}_loaded_models", "Model versions loaded and ready",
                            registry=r)
        # The failure reasons seen per (model, version): the family has a third label, so
        # forgetting a version must know which of its series exist.
        self._failure_reasons: dict[tuple[str, str], set[str]] = {}

    def _histogram(self, name: str, doc: str) -> Histogram:
        return Histogram(f"{PREFIX}_{name}", doc, LABELS, buckets=LATENCY_BUCKETS,
                         registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def for_version(self, model: str, version: str) -> VersionStats:
        return VersionStats(self, model, version)

    def failure_counter(self, model: str, version: str, reason: str) -> Any:
        """The failure series of one version and reason, remembered for ``forget``."""
        self._failure_reasons.setdefault((model, version), set()).add(reason)
        return self.failure.labels(model, version, reason)

    def forget(self, model: str, version: str) -> None:
        """Drop an unloaded version's series so /metrics does not grow forever."""
        for family in (self.success, self.inferences, self.executions, self.request_time,
                       self.queue_time, self.compute_time, self.batch_size, self.pending):
            with contextlib.suppress(KeyError):  # never observed: nothing to remove
                family.remove(model, version)
        for reason in self._failure_reasons.pop((model, version), ()):
            with contextlib.suppress(KeyError):
                self.failure.remove(model, version, reason)


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, times: int = 1) -> None:
        self.count += times
        self.ns += int(seconds * 1e9) * times

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchTotals:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class VersionStats(BatchObserver):
    """Statistics of one model version: Triton's JSON and the Prometheus children."""

    def __init__(self, metrics: Metrics, model: str, version: str) -> None:
        self.model, self.version = model, version
        self._metrics = metrics
        labels = (model, version)
        self._success = metrics.success.labels(*labels)
        self._inferences = metrics.inferences.labels(*labels)
        self._executions = metrics.executions.labels(*labels)
        self._request_time = metrics.request_time.labels(*labels)
        self._queue_time = metrics.queue_time.labels(*labels)
        self._compute_time = metrics.compute_time.labels(*labels)
        self._batch_size = metrics.batch_size.labels(*labels)
        self._pending = metrics.pending.labels(*labels)
        self._failures: dict[str, Any] = {}  # reason -> its counter, made on first use
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.totals = BatchTotals()
        self.batches: dict[int, BatchTotals] = {}

    # BatchObserver: called by the batcher on the event loop.
    def queued(self, pending: int) -> None:
        self._pending.set(pending)

    def dequeued(self, queue_s: float) -> None:
        self.queue.add(queue_s)
        self._queue_time.observe(queue_s)

    def batch(self, rows: int, requests: int, input_s: float, infer_s: float,
              output_s: float) -> None:
        self.inference_count += rows
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        totals = self.batches.get(rows)
        if totals is None:
            totals = self.batches[rows] = BatchTotals()
        # As in Triton: batch_stats count batches; inference_stats count requests, each
        # charged the whole compute time of the batch it ran in.
        for target, times in ((totals, 1), (self.totals, requests)):
            target.compute_input.add(input_s, times)
            target.compute_infer.add(infer_s, times)
            target.compute_output.add(output_s, times)
        self._inferences.inc(rows)
        self._executions.inc()
        self._batch_size.observe(rows)
        self._compute_time.observe(input_s + infer_s + output_s)

    def request(self, seconds: float, pending: int) -> None:
        self.success.add(seconds)
        self._success.inc()
        self._request_time.observe(seconds)
        self._pending.set(pending)

    def failed(self, seconds: float, reason: str, pending: int) -> None:
        self.fail.add(seconds)
        counter = self._failures.get(reason)
        if counter is None:
            counter = self._failures[reason] = self._metrics.failure_counter(
                self.model, self.version, reason)
        counter.inc()
        self._pending.set(pending)

    def to_dict(self) -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` list."""
        totals = self.totals
        return {
            "name": self.model,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_dict(),
                "fail": self.fail.to_dict(),
                "queue": self.queue.to_dict(),
                "compute_input": totals.compute_input.to_dict(),
                "compute_infer": totals.compute_infer.to_dict(),
                "compute_output": totals.compute_output.to_dict(),
                "cache_hit": Duration().to_dict(),
                "cache_miss": Duration().to_dict(),
            },
            "batch_stats": [
                {"batch_size": size,
                 "compute_input": b.compute_input.to_dict(),
                 "compute_infer": b.compute_infer.to_dict(),
                 "compute_output": b.compute_output.to_dict()}
                for size, b in sorted(self.batches.items())
            ],
        }
