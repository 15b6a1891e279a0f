"""The server's side of a run, read from its Prometheus ``/metrics``.

Triton names (``nv_inference_*``) and turboinfer's (``turboinfer_*``, Triton's meaning in
base units) are both read, and the parser is tolerant: counters with or without
``_total``, durations as microsecond counters or second histograms, whatever is there.
A snapshot is taken before and after each run and the difference is the run's share.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from turboinfer.load.endpoint import Endpoint
from turboinfer.load.http_client import HttpClient, build_request

PREFIXES = ("turboinfer_", "nv_")
# Candidates in order: Triton's names with turboinfer's prefix, turboinfer's short names
# (``turboinfer_request_success``, ``turboinfer_inference``...), then Triton's own.
SUCCESS = ("turboinfer_inference_request_success", "turboinfer_request_success",
           "nv_inference_request_success")
FAILURE = ("turboinfer_inference_request_failure", "turboinfer_request_failure",
           "nv_inference_request_failure")
INFERENCES = ("turboinfer_inference_count", "turboinfer_inference", "nv_inference_count")
EXECUTIONS = ("turboinfer_inference_exec_count", "turboinfer_execution",
              "turboinfer_exec_count", "nv_inference_exec_count")
MEMORY = ("turboinfer_process_resident_memory_bytes", "process_resident_memory_bytes",
          "turboinfer_process_memory_bytes", "nv_cpu_memory_used_bytes")
CPU_SECONDS = ("turboinfer_process_cpu_seconds_total", "process_cpu_seconds_total")
# Unit suffix of a duration metric -> milliseconds per unit.
UNITS_MS = {"_us": 1e-3, "_ms": 1.0, "_seconds": 1e3, "_ns": 1e-6}
_NOT_VALUES = ("_bucket", "_created", "_count")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return next((v for k, v in self.labels if k == key), None)


@dataclass(frozen=True)
class Snapshot:
    samples: tuple[Sample, ...]
    taken_ns: int

    def total(self, names: Sequence[str], model: str) -> float | None:
        """Sum of the first of ``names`` present (``_total`` optional), for ``model``."""
        for name in names:
            wanted = (name, f"{name}_total")
            found = [s.value for s in self._for_model(model) if s.name in wanted]
            if found:
                return sum(found)
        return None

    def select(self, keep: Callable[[str], bool], model: str) -> dict[str, float]:
        """Sample name -> summed value over the model's samples whose name passes."""
        out: dict[str, float] = {}
        for s in self._for_model(model):
            if keep(s.name):
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    def _for_model(self, model: str) -> list[Sample]:
        return [s for s in self.samples if s.label("model") in (None, model)]


def parse(text: str, taken_ns: int | None = None) -> Snapshot:
    """A snapshot of the Prometheus text format; unparsable text gives an empty one."""

    samples = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    except ValueError:
        samples = []
    return Snapshot(tuple(samples), time.perf_counter_ns() if taken_ns is None else taken_ns)


@dataclass(frozen=True)
class ServerSide:
    """What the server did during one run; ``None`` where it does not say."""

    requests_ok: float | None
    requests_failed: float | None
    avg_batch_size: float | None
    max_batch_size: int
    batch_efficiency: float | None
    queue_ms: float | None
    compute_ms: float | None
    request_ms: float | None
    memory_mb: float | None
    cpu_cores: float | None
    # The server's own pre- and post-processing per request that had any (None: the
    # server does none, or does not say).
    preprocess_ms: float | None = None
    postprocess_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def server_side(before: Snapshot, after: Snapshot, *, model: str,
                max_batch_size: int) -> ServerSide:
    ok = _delta(before, after, SUCCESS, model)
    inferences = _delta(before, after, INFERENCES, model)
    executions = _delta(before, after, EXECUTIONS, model)
    avg_batch = inferences / executions if inferences is not None and executions else None
    efficiency = (avg_batch / max_batch_size
                  if avg_batch is not None and max_batch_size > 0 else None)
    memory = after.total(MEMORY, model)
    cpu = _delta(before, after, CPU_SECONDS, model)
    wall_s = (after.taken_ns - before.taken_ns) / 1e9
    return ServerSide(
        requests_ok=ok,
        requests_failed=_delta(before, after, FAILURE, model),
        avg_batch_size=avg_batch,
        max_batch_size=max_batch_size,
        batch_efficiency=efficiency,
        queue_ms=_duration_ms(before, after, "queue", model, ok),
        compute_ms=_duration_ms(before, after, "compute", model, ok),
        request_ms=_duration_ms(before, after, "request_duration", model, ok),
        memory_mb=memory / 1e6 if memory is not None else None,
        cpu_cores=cpu / wall_s if cpu is not None and wall_s > 0 else None,
        preprocess_ms=_duration_ms(before, after, "preprocess", model, ok),
        postprocess_ms=_duration_ms(before, after, "postprocess", model, ok),
    )


def _delta(before: Snapshot, after: Snapshot, names: Sequence[str],
           model: str) -> float | None:
    end = after.total(names, model)
    if end is None:
        return None
    # A counter that went down means the server restarted: count from zero.
    start = before.total(names, model) or 0.0
    return end - start if end >= start else end


def _duration_ms(before: Snapshot, after: Snapshot, part: str, model: str,
                 requests: float | None) -> float | None:
    """Average milliseconds per request spent in ``part`` (queue, compute...).

    Histograms (``..._seconds_sum`` / ``_count``) average per observation; Triton's
    cumulative microsecond counters average per successful request. Triton splits
    compute into input, infer and output: their sum is the compute time.
    """
    prefix = _prefix_with(after, part, model)
    if prefix is None:
        return None

    def is_value(name: str) -> bool:
        return (name.startswith(prefix) and part in name and "duration" in name
                and not name.endswith(_NOT_VALUES))

    sums = _deltas(before.select(is_value, model), after.select(is_value, model))
    histograms = {n: v for n, v in sums.items() if n.endswith("_sum")}
    if histograms:
        counts = _deltas(before.select(_counts_of(histograms), model),
                         after.select(_counts_of(histograms), model))
        observations = max(counts.values(), default=0.0)
        total = sum(v * _unit_ms(n) for n, v in histograms.items())
        return total / observations if observations else None
    if not sums or not requests:
        return None
    return sum(v * _unit_ms(n) for n, v in sums.items()) / requests


def _prefix_with(snapshot: Snapshot, part: str, model: str) -> str | None:
    """turboinfer's own names win over Triton's when a server exposes both."""
    names = snapshot.select(lambda n: part in n and "duration" in n, model)
    return next((p for p in PREFIXES if any(n.startswith(p) for n in names)), None)


def _counts_of(histograms: dict[str, float]) -> Callable[[str], bool]:
    wanted = {name[: -len("_sum")] + "_count" for name in histograms}
    return lambda name: name in wanted


def _deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def _unit_ms(name: str) -> float:
    base = name.removesuffix("_sum").removesuffix("_total")
    for suffix, scale in UNITS_MS.items():
        if base.endswith(suffix):
            return scale
    return 1e3  # Prometheus base unit: seconds


class MetricsSource:
    """Scrapes one ``/metrics`` URL; after a failure it stops trying (and says so once)."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url
        self._endpoint = Endpoint.parse(url)
        self._http: HttpClient | None = None
        self._timeout_s = timeout_s
        self.unavailable = ""

    async def snapshot(self) -> Snapshot | None:
        if self.unavailable:
            return None
        if self._http is None:
            self._http = HttpClient(self._endpoint, timeout_s=self._timeout_s,
                                    max_connections=2)
        try:
            response = await self._http.send(build_request(self._endpoint, "GET", ""))
        except (OSError, TimeoutError) as exc:
            self.unavailable = f"{self.url}: {exc or type(exc).__name__}"
            return None
        if not response.ok:
            self.unavailable = f"{self.url}: HTTP {response.status}"
            return None
        return parse(response.body.decode("utf-8", "replace"))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
