"""A running server over a window: ``/metrics`` scraped at its start and end (and once a
second between, for the queue depth), read as the window's deltas.

turboinfer's histograms give percentiles of request, queue and compute time; Triton's
names (``nv_inference_*``, microsecond counters) give averages only, through the same
reader the load tester uses (``load.metrics``).
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import orjson

from turboinfer.errors import InvalidInputError
from turboinfer.load.endpoint import Endpoint
from turboinfer.load.metrics import CPU_SECONDS, FAILURE, SUCCESS, Snapshot, parse, server_side
from turboinfer.serve.metrics import PREFIX

REQUEST = f"{PREFIX}_request_duration_seconds"
QUEUE = f"{PREFIX}_queue_duration_seconds"
COMPUTE = f"{PREFIX}_compute_duration_seconds"
PENDING = (f"{PREFIX}_pending_requests", "nv_inference_pending_request_count")
CPU_WAIT = (f"{PREFIX}_cpu_wait_seconds",)
USABLE_CORES = (f"{PREFIX}_usable_cores",)
GPU_UTILISATION = f"{PREFIX}_gpu_utilisation_ratio"
GPU_USED = f"{PREFIX}_gpu_memory_used_bytes"
GPU_TOTAL = f"{PREFIX}_gpu_memory_total_bytes"
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Percentiles:
    p50_ms: float
    p99_ms: float
    mean_ms: float


@dataclass(frozen=True)
class GpuUse:
    """One GPU over the window, from the server's per-second scrapes."""

    gpu: str
    name: str
    utilisation: float          # mean of the scraped values, 0..1
    memory_used_bytes: float    # the most seen in use
    memory_total_bytes: float
    samples: int


@dataclass(frozen=True)
class ServerWindow:
    url: str
    model: str
    seconds: float
    requests: float
    failures: float
    request: Percentiles | None      # None when the server has no histogram (Triton)
    queue: Percentiles | None
    compute: Percentiles | None
    queue_mean_ms: float | None
    compute_mean_ms: float | None
    avg_batch: float | None
    max_batch_size: int
    batch_efficiency: float | None
    max_pending: float | None
    cpu_cores: float | None
    instances: int
    # Failed requests in the window by the server's reason label (turboinfer's
    # rejected / invalid_input / backend, Triton's REJECTED / BACKEND / OTHER).
    failure_reasons: dict[str, float] = field(default_factory=dict)
    # The server process's CPU seconds in the window and the seconds its threads waited
    # for a CPU (None when its /metrics has no such counter), and its usable cores.
    cpu_seconds: float | None = None
    cpu_wait_seconds: float | None = None
    usable_cores: float | None = None
    gpus: tuple[GpuUse, ...] = ()
    # The batch window's bound from the server's config door (Triton's
    # max_queue_delay_microseconds); 0 without dynamic batching, None when unknown.
    max_queue_delay_ms: float | None = None
    # The model runs on a GPU (its instance group is KIND_GPU); None when the server
    # has no config door to say.
    on_gpu: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (vars(v) if isinstance(v, Percentiles) else
                    [vars(g) for g in v] if k == "gpus" else v) for k, v in vars(self).items()}


def fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise InvalidInputError(f"cannot read {url}: {reason}") from None


def scrape(base: str) -> Snapshot:
    return parse(fetch(f"{base}/metrics").decode("utf-8", "replace"))


def busiest_model(snapshot: Snapshot) -> str:
    counts: dict[str, float] = {}
    for s in snapshot.samples:
        model = s.label("model")
        if model and s.name.removesuffix("_total") in SUCCESS:
            counts[model] = counts.get(model, 0.0) + s.value
    if not counts:
        raise InvalidInputError("the server's /metrics names no model; give --model")
    return max(counts, key=lambda m: counts[m])


def observe(url: str, *, model: str | None, seconds: float) -> ServerWindow:
    """Scrape ``url`` over ``seconds``; the model defaults to the busiest one."""
    base = Endpoint.parse(url).url
    start = scrape(base)
    pending: list[float] = []
    scrapes = [start]
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        end = scrape(base)
        scrapes.append(end)
        pending.append(_gauge(end, PENDING, model or busiest_model(end)))
    end = scrape(base)
    scrapes.append(end)
    model = model or busiest_model(end)
    config = _config(base, model)
    max_batch = int(config.get("max_batch_size", 0))
    side = server_side(start, end, model=model, max_batch_size=max_batch)
    groups = config.get("instance_group") or [{}]
    return ServerWindow(
        url=base, model=model, seconds=(end.taken_ns - start.taken_ns) / 1e9,
        requests=side.requests_ok or 0.0, failures=side.requests_failed or 0.0,
        request=histogram(start, end, REQUEST, model),
        queue=histogram(start, end, QUEUE, model),
        compute=histogram(start, end, COMPUTE, model),
        queue_mean_ms=side.queue_ms, compute_mean_ms=side.compute_ms,
        avg_batch=side.avg_batch_size, max_batch_size=max_batch,
        batch_efficiency=side.batch_efficiency, max_pending=max(pending, default=None),
        cpu_cores=side.cpu_cores, instances=int(groups[0].get("count", 1)),
        failure_reasons=failure_reasons(start, end, model),
        cpu_seconds=_delta(start, end, CPU_SECONDS), cpu_wait_seconds=_delta(start, end, CPU_WAIT),
        usable_cores=end.total(USABLE_CORES, model), gpus=gpu_use(scrapes),
        max_queue_delay_ms=queue_delay_ms(config),
        on_gpu=any(g.get("kind") == "KIND_GPU" for g in groups) if config else None)


def queue_delay_ms(config: dict[str, Any]) -> float | None:
    """The batch window's bound in a Triton-format model config."""
    if not config:
        return None
    batching = config.get("dynamic_batching")
    if not isinstance(batching, dict):
        return 0.0
    return float(batching.get("max_queue_delay_microseconds", 0)) / 1e3


def _delta(start: Snapshot, end: Snapshot, names: tuple[str, ...]) -> float | None:
    """A process-wide counter's growth over the window (no model label)."""
    after = end.total(names, "")
    return None if after is None else after - (start.total(names, "") or 0.0)


def gpu_use(scrapes: list[Snapshot]) -> tuple[GpuUse, ...]:
    """Each GPU's mean utilisation and peak memory over the scrapes that name it."""
    seen: dict[str, dict[str, list[float]]] = {}
    names: dict[str, str] = {}
    for snapshot in scrapes:
        for s in snapshot.samples:
            gpu = s.label("gpu")
            if gpu is not None and s.name in (GPU_UTILISATION, GPU_USED, GPU_TOTAL):
                seen.setdefault(gpu, {}).setdefault(s.name, []).append(s.value)
                names[gpu] = s.label("name") or f"GPU {gpu}"
    out = []
    for gpu, series in sorted(seen.items()):
        used, total = series.get(GPU_USED, [0.0]), series.get(GPU_TOTAL, [0.0])
        utilisation = series.get(GPU_UTILISATION, [])
        if utilisation:
            out.append(GpuUse(gpu, names[gpu], sum(utilisation) / len(utilisation),
                              max(used), max(total), len(utilisation)))
    return tuple(out)


def failure_reasons(start: Snapshot, end: Snapshot, model: str) -> dict[str, float]:
    """Failures of ``model`` between two scrapes, by reason; reasons with none left out."""
    def by_reason(snapshot: Snapshot) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in snapshot.samples:
            if s.name.removesuffix("_total") in FAILURE and s.label("model") == model:
                reason = s.label("reason") or "unknown"
                out[reason] = out.get(reason, 0.0) + s.value
        return out

    before, after = by_reason(start), by_reason(end)
    deltas = {reason: n - before.get(reason, 0.0) for reason, n in after.items()}
    return {reason: n for reason, n in sorted(deltas.items()) if n > 0}


def _config(base: str, model: str) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = orjson.loads(fetch(f"{base}/v2/models/{model}/config"))
    except (InvalidInputError, orjson.JSONDecodeError):
        return {}  # not every server has Triton's config door; batching is then unknown
    return doc


def _gauge(snapshot: Snapshot, names: tuple[str, ...], model: str) -> float:
    return snapshot.total(names, model) or 0.0


def histogram(start: Snapshot, end: Snapshot, name: str, model: str) -> Percentiles | None:
    """p50, p99 and mean of one histogram's observations in the window."""
    before, after = _buckets(start, name, model), _buckets(end, name, model)
    if not after:
        return None
    deltas = [(le, count - before.get(le, 0.0)) for le, count in sorted(after.items())]
    total = deltas[-1][1]
    sums = [end.total((f"{name}_sum",), model), start.total((f"{name}_sum",), model)]
    if total <= 0 or sums[0] is None:
        return None
    mean = (sums[0] - (sums[1] or 0.0)) / total
    return Percentiles(quantile(deltas, 0.5) * 1e3, quantile(deltas, 0.99) * 1e3, mean * 1e3)


def _buckets(snapshot: Snapshot, name: str, model: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for s in snapshot.samples:
        if s.name == f"{name}_bucket" and s.label("model") in (None, model):
            le = float(s.label("le") or "inf")
            out[le] = out.get(le, 0.0) + s.value
    return out


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' ``histogram_quantile``: linear within the bucket the rank falls in."""
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower  # beyond the last finite bucket: its bound is all we know
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = le, count
    return lower
