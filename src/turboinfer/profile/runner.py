"""Profile one model on one engine: time it unprofiled, then under the engine's own
profiler, and aggregate the profiled runs.

The unprofiled timing is the session time a user would see; the profiled runs give the
operator times and their own wall time, whose difference from the unprofiled one is
the profiler's cost.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from turboinfer.bench.latency import feeds_for, time_runs
from turboinfer.engines import get_engine, load_session
from turboinfer.engines.base import Feeds, ModelArtifact
from turboinfer.errors import ConfigError
from turboinfer.hardware import profile as hardware_profile
from turboinfer.models import ResolvedModel
from turboinfer.profile.aggregate import aggregate
from turboinfer.profile.report import ProfileReport
from turboinfer.profile.samples import Profiled, ProfileSettings, write_trace

Profiler = Callable[[ModelArtifact, ProfileSettings, Feeds], Profiled]

# engine -> (module, function): imported only for the engine asked for, since each
# pulls in its engine's library.
PROFILERS: dict[str, tuple[str, str]] = {
    "onnxruntime": ("turboinfer.profile.ort_profiler", "profile_ort"),
    "openvino": ("turboinfer.profile.openvino_profiler", "profile_openvino"),
    "torch": ("turboinfer.profile.torch_profiler", "profile_torch"),
}


def run_profile(model: ResolvedModel, settings: ProfileSettings,
                trace: Path | None = None) -> ProfileReport:
    """Profile ``model``; write a chrome-trace of the profiled runs to ``trace`` if given."""
    profiler = _profiler(settings.engine, model)
    feeds, unprofiled_ms = _unprofiled(model, settings)
    profiled = profiler(model.artifact, settings, feeds)
    if trace is not None:
        write_trace(profiled.trace, trace)
    return ProfileReport(
        model=model.name, engine=settings.engine, batch_size=settings.batch_size,
        threads=settings.engine_settings.intra_op_threads, warmup_runs=settings.warmup_runs,
        unprofiled_session_ms=unprofiled_ms, aggregate=aggregate(profiled.samples),
        machine=hardware_profile().summary(), notes=profiled.notes,
        trace=str(trace) if trace is not None else None)


def _profiler(engine: str, model: ResolvedModel) -> Profiler:
    if engine not in PROFILERS:
        raise ConfigError(f"unknown engine {engine!r}; known: {', '.join(PROFILERS)}")
    get_engine(engine)  # a missing optional engine fails here, naming its extra
    if engine == "torch" and model.artifact.torch_module is None:
        # The torch engine runs the original module; an ONNX file has none behind it.
        raise ConfigError(f"the torch engine runs the PyTorch module and {model.name} is only "
                          f"an ONNX file; profile a builtin or a package.module:factory")
    module, function = PROFILERS[engine]
    found: Profiler = getattr(importlib.import_module(module), function)
    return found


def _unprofiled(model: ResolvedModel, settings: ProfileSettings) -> tuple[Feeds, float]:
    """The inputs, and the mean session time with no profiler attached."""
    session = load_session(model.artifact, settings.engine, settings.engine_settings)
    feeds = feeds_for(model, session, settings.batch_size, {})
    session.run(feeds)  # bad inputs fail here, before any timing
    durations = time_runs(session.run, feeds, min_runs=settings.runs, min_seconds=0.0,
                          warmup_runs=settings.warmup_runs)
    return feeds, sum(durations) / len(durations) / 1e6
