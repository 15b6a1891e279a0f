"""How many replicas of a model, on how many CPUs, scaling on what: derived once from the
repository entry (``config.yaml``, and ``tune/report.json`` when ``tune`` wrote one), and
read by both the Ray Serve deployment and the KServe export.

The autoscaling section speaks of instances, CPU utilisation and request rate; Ray
Serve's autoscaler and KServe's replica bounds speak of replicas and ongoing requests.
The mapping:

- replicas: ``min_instances`` .. ``max_instances`` (unset: the usable cores divided by
  the CPUs one replica takes), one replica being the whole tuned configuration
  (``instances`` engine instances of ``intra_op_threads`` threads each);
- Ray's ``target_ongoing_requests``: what one replica holds when it runs at the
  ``scale_up_cpu_utilization`` share of its tuned capacity. By Little's law a replica at
  capacity holds its throughput times its latency in requests; at the tuned point that is
  one full batch per instance (``max_batch_size`` rows in service, or the measured
  ``qps x p99`` when ``tune`` recorded them). Ray adds a replica when the average ongoing
  count per replica stays above the target for ``upscale_delay_s`` (the scale-up window)
  and removes one when it stays below for ``downscale_delay_s`` (the scale-down window,
  at least the cool-down). Ray has one target where the in-server scaler has a CPU and a
  rate threshold: a replica under 5 QPS holds far fewer requests than the target, so the
  scale-down rate is met by the same comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from turboinfer.serve.config import ModelConfig

# The memory one replica requests on top of its model files: the Python process with
# onnxruntime, the server core and its buffers, as measured for the built-in models.
BASE_MEMORY_MIB = 512
TUNE_REPORT = Path("tune") / "report.json"


@dataclass(frozen=True)
class TunedPoint:
    """What ``tune`` measured for the chosen configuration: requests per second one
    replica sustains and the p99 latency of one batch, both at the tuned batch size."""

    qps: float
    p99_ms: float


@dataclass(frozen=True)
class ReplicaPlan:
    min_replicas: int
    max_replicas: int
    initial_replicas: int
    cpus_per_replica: int
    target_ongoing_requests: float
    max_ongoing_requests: int
    upscale_delay_s: float
    downscale_delay_s: float
    memory_mib: int
    autoscaling: bool

    def ray_autoscaling_config(self) -> dict[str, Any] | None:
        if not self.autoscaling:
            return None
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "initial_replicas": self.initial_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s}


def tuned_point(model_dir: Path) -> TunedPoint | None:
    """The chosen configuration's throughput and p99 from ``tune``'s report, if any."""
    try:
        report = orjson.loads((model_dir / TUNE_REPORT).read_bytes())
        plan = report["chosen"]["plan"]
        qps, p99 = float(plan["qps"]), float(plan["p99_ms"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return TunedPoint(qps, p99) if qps > 0 and p99 > 0 else None


def cpus_per_replica(config: ModelConfig, usable_cores: int) -> int:
    """The cores one replica reserves: its instances times their intra-op threads. An
    entry without a thread count (0: the engine takes what it finds) reserves one core
    per instance, so that several such models still fit on one machine."""
    threads = config.engine_settings.intra_op_threads or 1
    return max(1, min(usable_cores, threads * config.instances))


def plan_replicas(config: ModelConfig, usable_cores: int, *, tuned: TunedPoint | None = None,
                  replicas: int | None = None, model_bytes: int = 0) -> ReplicaPlan:
    """The replica plan of one model; ``replicas`` fixes the count (no autoscaling)."""
    scaling = config.autoscaling
    cpus = cpus_per_replica(config, usable_cores)
    per_batch = max(1, config.max_batch_size)
    full = float(per_batch * config.instances)
    if tuned is not None:
        # Little's law at the tuned point: ongoing = rate x time in the server.
        full = max(1.0, tuned.qps * tuned.p99_ms / 1000)
    target = max(1.0, round(scaling.scale_up_cpu_utilization * full, 2))
    autoscaling = replicas is None and scaling.enabled
    if autoscaling:
        low = scaling.min_instances
        high = scaling.max_instances or max(low, usable_cores // cpus)
    else:
        low = high = replicas if replicas is not None else 1
    memory = BASE_MEMORY_MIB + math.ceil(model_bytes * 2 * config.instances / 2**20)
    return ReplicaPlan(
        min_replicas=low, max_replicas=high, initial_replicas=low, cpus_per_replica=cpus,
        target_ongoing_requests=target,
        # Room for a full batch per instance waiting behind the one running, so batches
        # keep forming; beyond it requests wait in Ray's router, where the autoscaler
        # counts them.
        max_ongoing_requests=max(4, 2 * per_batch * config.instances),
        upscale_delay_s=scaling.scale_up_window_s,
        downscale_delay_s=max(scaling.scale_down_window_s, scaling.cooldown_s),
        memory_mib=memory, autoscaling=autoscaling)
