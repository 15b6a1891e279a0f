"""One model's statistics across all of its replicas, exact and up to date.

A replica keeps turboinfer's own ``VersionStats`` and also logs every observation it
makes (a version serving, a request queued, dequeued, answered or failed, a batch run).
The log leaves the replica with each answer it sends, so the ingress replays it into its
own ``Metrics``: every batch is observed before the answers of the requests in it, so by
the time a client has its answer, the ingress has its statistics. Counters and
histograms then add up over the replicas exactly as if one server had served them all;
the pending-requests gauge shows the value the last replica reported.
"""

from __future__ import annotations

from typing import Any

from turboinfer.serve.metrics import Metrics, VersionStats

# (observation, model, version, *arguments): plain tuples, cheap to pickle.
Event = tuple[Any, ...]
_REPLAYED = ("queued", "dequeued", "batch", "request", "failed")


class RecordingMetrics(Metrics):
    """A replica's metrics that also keep the log the ingress replays."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[Event] = []

    def for_version(self, model: str, version: str, *, max_batch_size: int = 0,
                    weight_bytes: int = 0, on_gpu: bool = False) -> VersionStats:
        return RecordingStats(self, model, version, max_batch_size=max_batch_size,
                              weight_bytes=weight_bytes, on_gpu=on_gpu)

    def serving(self, stats: VersionStats) -> None:
        super().serving(stats)
        self.log.append(("serving", stats.model, stats.version, stats.max_batch_size,
                         stats.weight_bytes, stats.on_gpu))

    def drain(self) -> list[Event]:
        """The observations since the last drain, oldest first."""
        events, self.log = self.log, []
        return events


class RecordingStats(VersionStats):
    def __init__(self, metrics: RecordingMetrics, model: str, version: str, *,
                 max_batch_size: int = 0, weight_bytes: int = 0, on_gpu: bool = False) -> None:
        super().__init__(metrics, model, version, max_batch_size=max_batch_size,
                         weight_bytes=weight_bytes, on_gpu=on_gpu)
        self._recorder = metrics

    def _record(self, *event: Any) -> None:
        # The metrics object swaps its list on each drain: append to the current one.
        self._recorder.log.append((event[0], self.model, self.version, *event[1:]))

    def queued(self, pending: int) -> None:
        super().queued(pending)
        self._record("queued", pending)

    def dequeued(self, queue_s: float) -> None:
        super().dequeued(queue_s)
        self._record("dequeued", queue_s)

    def batch(self, rows: int, requests: int, input_s: float, infer_s: float,
              output_s: float) -> None:
        super().batch(rows, requests, input_s, infer_s, output_s)
        self._record("batch", rows, requests, input_s, infer_s, output_s)

    def request(self, seconds: float, pending: int) -> None:
        super().request(seconds, pending)
        self._record("request", seconds, pending)

    def failed(self, seconds: float, reason: str, pending: int) -> None:
        super().failed(seconds, reason, pending)
        self._record("failed", seconds, reason, pending)


def replay(metrics: Metrics, events: list[Event]) -> None:
    """Apply a replica's observations to the ingress's metrics."""
    for kind, model, version, *args in events:
        stats = metrics.versions.get((model, version))
        if kind == "serving":
            if stats is None:
                max_batch_size, weight_bytes, on_gpu = args
                metrics.serving(metrics.for_version(model, version,
                                                    max_batch_size=max_batch_size,
                                                    weight_bytes=weight_bytes, on_gpu=on_gpu))
                metrics.loaded.set(len(metrics.versions))
        elif stats is not None and kind in _REPLAYED:
            getattr(stats, kind)(*args)
