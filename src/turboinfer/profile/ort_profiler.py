"""ONNX Runtime's own profiler: ``enable_profiling`` writes a chrome-trace JSON with one
``<node>_kernel_time`` event per node and one ``model_run`` event per run."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort

from turboinfer.engines.base import Feeds, ModelArtifact
from turboinfer.engines.onnxruntime import OrtSession, providers_for, session_options
from turboinfer.errors import ModelLoadError
from turboinfer.profile.samples import OpTime, Profiled, ProfileSettings, RunSample

_KERNEL_SUFFIX = "_kernel_time"


def profile_ort(artifact: ModelArtifact, settings: ProfileSettings, feeds: Feeds) -> Profiled:
    with tempfile.TemporaryDirectory(prefix="turboinfer-ort-profile-") as scratch:
        session, walls = _profiled_runs(artifact, settings, feeds, Path(scratch))
        events = json.loads(Path(session.session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    nodes = [e for e in events
             if e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)]
    # The profiler saw the warm-up runs too: keep the last ``runs`` of them.
    measured = runs[len(runs) - len(walls):]
    samples = [RunSample(wall, _ops_within(run, nodes)) for run, wall in zip(measured, walls,
                                                                              strict=True)]
    first_ts = measured[0]["ts"] if measured else 0
    kept = [e for e in events if e.get("ph") != "X" or e.get("ts", 0) >= first_ts]
    return Profiled(samples, {"traceEvents": kept, "displayTimeUnit": "ms"})


def _profiled_runs(artifact: ModelArtifact, settings: ProfileSettings, feeds: Feeds,
                   scratch: Path) -> tuple[OrtSession, list[float]]:
    options = session_options(settings.engine_settings)
    options.enable_profiling = True
    options.profile_file_prefix = str(scratch / "ort")
    try:
        raw = ort.InferenceSession(str(artifact.onnx_path), sess_options=options,
                                   providers=providers_for(settings.engine_settings.device))
    except Exception as exc:  # ORT raises bare pybind errors; report them in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"onnxruntime cannot load {artifact.onnx_path}: {first}") from None
    session = OrtSession(raw)
    for _ in range(settings.warmup_runs):
        session.run(feeds)
    walls = []
    for _ in range(settings.runs):
        start = time.perf_counter_ns()
        session.run(feeds)
        walls.append((time.perf_counter_ns() - start) / 1e6)
    return session, walls


def _ops_within(run: dict[str, Any], nodes: list[dict[str, Any]]) -> tuple[OpTime, ...]:
    """The node events inside one ``model_run`` event (both in microseconds)."""
    start, end = run["ts"], run["ts"] + run["dur"]
    return tuple(
        OpTime(str(e["name"])[: -len(_KERNEL_SUFFIX)],
               str(e.get("args", {}).get("op_name", "?")), e["dur"] / 1000.0)
        for e in nodes if start <= e["ts"] <= end
    )
