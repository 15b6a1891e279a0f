"""OpenVINO's per-layer performance counters (``PERF_COUNT``): after each inference the
request lists every executed layer of the compiled graph with its real time."""

from __future__ import annotations

import time
from typing import Any

import openvino as ov

from turboinfer.engines.base import Feeds, ModelArtifact
from turboinfer.engines.openvino import OpenVinoSession
from turboinfer.errors import ConfigError, ModelLoadError
from turboinfer.profile.samples import OpTime, Profiled, ProfileSettings, RunSample


def profile_openvino(artifact: ModelArtifact, settings: ProfileSettings,
                     feeds: Feeds) -> Profiled:
    session = OpenVinoSession(_compile(artifact, settings))
    for _ in range(settings.warmup_runs):
        session.run(feeds)
    samples = []
    for _ in range(settings.runs):
        start = time.perf_counter_ns()
        session.run(feeds)
        wall_ms = (time.perf_counter_ns() - start) / 1e6
        samples.append(RunSample(wall_ms, _layers(session.request.profiling_info)))
    notes = ["openvino reports layer durations without start times: the trace lays each "
             "run's layers end to end from the run's start"]
    return Profiled(samples, {"traceEvents": trace_events(samples), "displayTimeUnit": "ms"},
                    notes)


def _compile(artifact: ModelArtifact, settings: ProfileSettings) -> Any:
    """The same configuration as the openvino engine, with the counters switched on."""
    engine = settings.engine_settings
    if engine.device != "cpu":
        raise ConfigError("the openvino engine runs on the CPU here; use device 'cpu'")
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                              "PERF_COUNT": True}
    if engine.intra_op_threads:
        config["INFERENCE_NUM_THREADS"] = engine.intra_op_threads
    try:
        return ov.Core().compile_model(str(artifact.onnx_path), "CPU", config)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"openvino cannot load {artifact.onnx_path}: {first}") from None


def _layers(infos: list[Any]) -> tuple[OpTime, ...]:
    # Fused-away layers are listed as NOT_RUN / OPTIMIZED_OUT with zero time.
    return tuple(OpTime(info.node_name, info.node_type, info.real_time.total_seconds() * 1e3)
                 for info in infos if info.status == ov.ProfilingInfo.Status.EXECUTED)


def trace_events(samples: list[RunSample]) -> list[dict[str, Any]]:
    """Chrome-trace complete events (microseconds): a ``run`` per sample, its layers under it."""
    events: list[dict[str, Any]] = []
    start_us = 0.0
    for index, sample in enumerate(samples):
        events.append({"name": "run", "cat": "Session", "ph": "X", "pid": 1, "tid": 1,
                       "ts": start_us, "dur": sample.wall_ms * 1e3, "args": {"run": index}})
        at = start_us
        for op in sample.ops:
            events.append({"name": op.node, "cat": "Node", "ph": "X", "pid": 1, "tid": 1,
                           "ts": at, "dur": op.ms * 1e3, "args": {"op_type": op.op_type}})
            at += op.ms * 1e3
        start_us += sample.wall_ms * 1e3
    return events
