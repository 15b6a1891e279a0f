"""Prometheus metrics and Triton-style statistics, fed by the same hot-path calls.

Metric names follow Triton's semantics with a ``turboinfer_`` prefix and base units
(seconds, not microseconds). ``inference_total / execution_total`` is the average batch
size. Each server owns its registry, so several servers in one process never collide.

The golden metrics that are ratios or machine-wide (utilisation, batch efficiency, the
memory-traffic proxy) are computed when /metrics is scraped, by ``GoldenCollector``,
from counters the hot path already keeps: serving a request costs nothing more for them.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from turboinfer.hardware.cgroup import cpu_limit
from turboinfer.hardware.gpu import GpuSampler
from turboinfer.hardware.schedstat import WaitCounter
from turboinfer.serve.batcher import BatchObserver

PREFIX = "turboinfer"
LABELS = ("model", "version")
# Latency buckets from 100 µs to 10 s: CPU inference of small models lives below 1 ms.
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
COLD_START_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The metric families of one server."""

    def __init__(self, gpus: GpuSampler | None = None) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(namespace=PREFIX, registry=self.registry)
        r = self.registry
        # The per-version counters, histograms and the pending gauge are not
        # prometheus_client families: serving a request updates plain fields of its
        # VersionStats on the event loop (no lock per update, no bucket loop), and
        # GoldenCollector renders them per scrape with the same names.
        self.failure = Counter(f"{PREFIX}_request_failure", "Failed inference requests",
                               (*LABELS, "reason"), registry=r)
        self.loaded = Gauge(f"{PREFIX}_loaded_models", "Model versions loaded and ready",
                            registry=r)
        # Autoscaling and idle unload (serve.autoscale): the instances each version runs
        # now (0 while idle-unloaded), every scale event with its reason, cold starts.
        self.instances = Gauge(f"{PREFIX}_instances", "Engine instances serving the version",
                               LABELS, registry=r)
        self.scale_events = Counter(f"{PREFIX}_scale_events",
                                    "Instances added (up) or removed (down), by reason",
                                    ("model", "direction", "reason"), registry=r)
        self.cold_start = Histogram(f"{PREFIX}_cold_start_seconds",
                                    "First request after idle unload until an instance "
                                    "serves (build and warm-up)", LABELS,
                                    buckets=COLD_START_BUCKETS, registry=r)
        self.last_cold_start = Gauge(f"{PREFIX}_last_cold_start_seconds",
                                     "The version's latest cold start", LABELS, registry=r)
        # The failure reasons seen per (model, version): the family has a third label, so
        # forgetting a version must know which of its series exist.
        self._failure_reasons: dict[tuple[str, str], set[str]] = {}
        # The versions served, read by the scrape-time collector.
        self.versions: dict[tuple[str, str], VersionStats] = {}
        r.register(GoldenCollector(self, gpus))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def for_version(self, model: str, version: str, *, max_batch_size: int = 0,
                    weight_bytes: int = 0, on_gpu: bool = False) -> VersionStats:
        return VersionStats(self, model, version, max_batch_size=max_batch_size,
                            weight_bytes=weight_bytes, on_gpu=on_gpu)

    @property
    def serves_on_gpu(self) -> bool:
        """A served version runs on a GPU: only then are the GPU families filled."""
        return any(stats.on_gpu for stats in list(self.versions.values()))

    def serving(self, stats: VersionStats) -> None:
        """A version that loaded and warmed up: the scrape-time collector reads it. A
        version whose load failed is never named here, so it cannot shadow the version
        that still serves under the same number."""
        self.versions[(stats.model, stats.version)] = stats

    def failure_counter(self, model: str, version: str, reason: str) -> Any:
        """The failure series of one version and reason, remembered for ``forget``."""
        self._failure_reasons.setdefault((model, version), set()).add(reason)
        return self.failure.labels(model, version, reason)

    def forget(self, model: str, version: str) -> None:
        """Drop an unloaded version's series so /metrics does not grow forever."""
        self.versions.pop((model, version), None)
        for family in (self.instances, self.cold_start, self.last_cold_start):
            with contextlib.suppress(KeyError):  # never observed: nothing to remove
                family.remove(model, version)
        for reason in self._failure_reasons.pop((model, version), ()):
            with contextlib.suppress(KeyError):
                self.failure.remove(model, version, reason)


class LoopHistogram:
    """A histogram updated from one thread (the event loop): a count per bucket and the
    sum, without prometheus_client's lock per update and loop over the buckets. A scrape
    reads it as it stands (a request's update is never half seen: one bucket, then the
    sum)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)   # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def add_to(self, family: HistogramMetricFamily, labels: list[str]) -> None:
        """This histogram as one series of ``family`` (cumulative buckets)."""
        buckets, total = [], 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            total += count
            buckets.append((floatToGoString(bound), total))
        buckets.append(("+Inf", total + self.counts[-1]))
        family.add_metric(labels, buckets, self.sum)


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

    def __init__(self, metrics: Metrics, model: str, version: str, *,
                 max_batch_size: int = 0, weight_bytes: int = 0, on_gpu: bool = False) -> None:
        self.model, self.version = model, version
        self.max_batch_size, self.weight_bytes = max_batch_size, weight_bytes
        self.on_gpu = on_gpu
        self._metrics = metrics
        self.pending = 0
        self.request_time = LoopHistogram(LATENCY_BUCKETS)
        self.queue_time = LoopHistogram(LATENCY_BUCKETS)
        self.compute_time = LoopHistogram(LATENCY_BUCKETS)
        self.preprocess_time = LoopHistogram(LATENCY_BUCKETS)
        self.postprocess_time = LoopHistogram(LATENCY_BUCKETS)
        self.batch_size = LoopHistogram(BATCH_BUCKETS)
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
        self.pending = pending

    def dequeued(self, queue_s: float) -> None:
        self.queue.add(queue_s)
        self.queue_time.observe(queue_s)

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
        self.batch_size.observe(rows)
        self.compute_time.observe(input_s + infer_s + output_s)

    def preprocessed(self, seconds: float) -> None:
        self.preprocess_time.observe(seconds)

    def postprocessed(self, seconds: float) -> None:
        self.postprocess_time.observe(seconds)

    def request(self, seconds: float, pending: int) -> None:
        self.success.add(seconds)
        self.request_time.observe(seconds)
        self.pending = pending

    def failed(self, seconds: float, reason: str, pending: int) -> None:
        self.fail.add(seconds)
        counter = self._failures.get(reason)
        if counter is None:
            counter = self._failures[reason] = self._metrics.failure_counter(
                self.model, self.version, reason)
        counter.inc()
        self.pending = pending

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


def usable_cores() -> int:
    """Cores this process may keep busy: its CPU affinity capped by the cgroup quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    quota = cpu_limit()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def weight_bytes(model_file: Path) -> int:
    """Bytes of a model's weights on disk: the file and its external data (ONNX's
    ``model.onnx.data``, OpenVINO's ``model.bin``). 0 when unreadable: it only feeds a
    proxy metric and must never stop a model from loading."""
    companion = (model_file.with_suffix(".bin") if model_file.suffix == ".xml"
                 else Path(f"{model_file}.data"))
    total = 0
    for path in (model_file, companion):
        with contextlib.suppress(OSError):  # no external data is the common case
            total += path.stat().st_size
    return total


def torch_allocated() -> list[tuple[int, int]]:
    """(GPU, bytes) that torch's allocator holds for tensors of this process; empty when
    torch was never imported or never touched CUDA (asking must not create a context)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    return [(i, int(torch.cuda.memory_allocated(i))) for i in range(torch.cuda.device_count())]


class GoldenCollector(Collector):
    """Utilisation, batch efficiency and the memory-traffic proxy, computed per scrape.

    - ``turboinfer_cpu_utilisation_seconds_total``: process CPU seconds (all threads,
      user + system) divided by the usable cores; its ``rate()`` is the share of the
      machine's compute in use, 0..1.
    - ``turboinfer_batch_efficiency``: rows per executed batch over ``max_batch_size``
      since the version loaded; a window's value is
      ``rate(turboinfer_inference_total) / rate(turboinfer_execution_total) /
      turboinfer_max_batch_size``.
    - ``turboinfer_weight_bytes_read_total``: executions times the model's weight
      bytes. A proxy for memory bandwidth, not a measurement: each batch reads every
      weight once, activations are not counted, and weights that stay in cache never
      reach memory. Its ``rate()`` tells which model moves the most bytes.
    - ``turboinfer_cpu_wait_seconds_total``: seconds the server's threads were runnable
      but waiting for a CPU (schedstat); its ``rate()`` over the CPU seconds' is how
      contended the cores are. Absent where the kernel has no schedstat.
    - ``turboinfer_gpu_utilisation_ratio`` per GPU (NVML's SM activity, 0-1) and its
      memory in use and in all, and ``turboinfer_gpu_process_allocated_bytes``, what
      this process's torch tensors hold on each GPU; the families are empty unless a
      served version runs on a GPU (a GPU idle beside a CPU model is not the server's).
    """

    def __init__(self, metrics: Metrics, gpus: GpuSampler | None = None) -> None:
        self._metrics = metrics
        self._cores = usable_cores()
        self._waits = WaitCounter()
        self._gpus = gpus if gpus is not None else GpuSampler()

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(f"{PREFIX}_usable_cores",
                                "Cores this process may use (affinity, cgroup quota)",
                                value=self._cores)
        yield CounterMetricFamily(
            f"{PREFIX}_cpu_utilisation_seconds",
            "Process CPU seconds per usable core; rate() is the utilisation (0-1)",
            value=time.process_time() / self._cores)
        waited = self._waits.seconds()
        if waited is not None:
            yield CounterMetricFamily(
                f"{PREFIX}_cpu_wait_seconds",
                "Seconds the server's threads were runnable but waiting for a CPU",
                value=waited)
        yield from self._per_gpu()
        yield from self._per_version()

    def _per_gpu(self) -> Iterator[Metric]:
        gpu = ("gpu", "name")
        families = (
            GaugeMetricFamily(f"{PREFIX}_gpu_utilisation_ratio",
                              "Share of the last NVML sample period a kernel ran (SM%, 0-1)",
                              labels=gpu),
            GaugeMetricFamily(f"{PREFIX}_gpu_memory_used_bytes", "GPU memory in use",
                              labels=gpu),
            GaugeMetricFamily(f"{PREFIX}_gpu_memory_total_bytes", "GPU memory in all",
                              labels=gpu))
        process = GaugeMetricFamily(f"{PREFIX}_gpu_process_allocated_bytes",
                                    "GPU memory held by this process's torch tensors",
                                    labels=("gpu",))
        if not self._metrics.serves_on_gpu:
            yield from (*families, process)
            return
        for index, allocated in torch_allocated():
            process.add_metric([str(index)], allocated)
        yield process
        for sample in self._gpus.sample():
            labels = [str(sample.index), sample.name]
            for family, value in zip(families, (sample.utilisation, sample.memory_used_bytes,
                                                sample.memory_total_bytes), strict=True):
                family.add_metric(labels, value)
        yield from families

    def _per_version(self) -> Iterator[Metric]:
        max_batch = GaugeMetricFamily(
            f"{PREFIX}_max_batch_size", "The version's max_batch_size (0: no batching)",
            labels=LABELS)
        efficiency = GaugeMetricFamily(
            f"{PREFIX}_batch_efficiency",
            "Average rows per batch / max_batch_size since the version loaded (0-1)",
            labels=LABELS)
        weights = GaugeMetricFamily(
            f"{PREFIX}_model_weight_bytes", "Bytes of the model's weights on disk",
            labels=LABELS)
        read = CounterMetricFamily(
            f"{PREFIX}_weight_bytes_read",
            "Executions x weight bytes: a proxy for memory traffic, not a measurement",
            labels=LABELS)
        counters = [CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=LABELS)
                    for name, doc in _COUNTERS]
        histograms = [HistogramMetricFamily(f"{PREFIX}_{name}", doc, labels=LABELS)
                      for name, doc in _HISTOGRAMS]
        pending = GaugeMetricFamily(f"{PREFIX}_pending_requests",
                                    "Requests waiting in queues", labels=LABELS)
        # A copy: versions load and unload on the event loop while a scrape may run.
        for stats in list(self._metrics.versions.values()):
            labels = [stats.model, stats.version]
            for counter, value in zip(counters, (stats.success.count, stats.inference_count,
                                                 stats.execution_count), strict=True):
                counter.add_metric(labels, value)
            for series, histogram in zip(histograms, (
                    stats.request_time, stats.queue_time, stats.compute_time,
                    stats.preprocess_time, stats.postprocess_time, stats.batch_size),
                    strict=True):
                histogram.add_to(series, labels)
            pending.add_metric(labels, stats.pending)
            max_batch.add_metric(labels, stats.max_batch_size)
            if stats.max_batch_size > 0 and stats.execution_count:
                efficiency.add_metric(labels, stats.inference_count / (
                    stats.execution_count * stats.max_batch_size))
            weights.add_metric(labels, stats.weight_bytes)
            read.add_metric(labels, stats.execution_count * stats.weight_bytes)
        yield from (*counters, *histograms, pending, max_batch, efficiency, weights, read)


# The per-version families GoldenCollector renders from VersionStats: name, help.
_COUNTERS = (("request_success", "Successful inference requests"),
             ("inference", "Inferences (rows) performed"),
             ("execution", "Batches executed"))
_HISTOGRAMS = (
    ("request_duration_seconds", "End-to-end request time in the server"),
    ("queue_duration_seconds", "Time spent queued"),
    ("compute_duration_seconds", "Batch compute time (input, infer, output)"),
    # The server's own pre- and post-processing (decoding images, tokenizing text;
    # labels, pooling): per request that had any, outside queue and compute.
    ("preprocess_duration_seconds",
     "Pre-processing time of a request (decode, tokenize), before it is queued"),
    ("postprocess_duration_seconds",
     "Post-processing time of a request (labels, pooling), after its batch ran"),
    ("batch_size", "Rows per executed batch"))
