"""``torch.profiler`` over the torch engine's eager module: each run is wrapped in a
``record_function`` marker, and the aten ops directly under it are that run's operators
(their inclusive time, so nested calls are counted once)."""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile, record_function

from turboinfer.engines import get_engine
from turboinfer.engines.base import Feeds, ModelArtifact, Session
from turboinfer.profile.samples import OpTime, Profiled, ProfileSettings, RunSample

_MARKER = "turboinfer::run"


def profile_torch(artifact: ModelArtifact, settings: ProfileSettings, feeds: Feeds) -> Profiled:
    session = get_engine("torch").load(artifact, settings.engine_settings)
    for _ in range(settings.warmup_runs):
        session.run(feeds)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        walls = _timed_runs(session, feeds, settings.runs)
    markers = [e for e in prof.events() if e.name == _MARKER]
    samples = [RunSample(wall, _ops_under(marker)) for marker, wall in zip(markers, walls,
                                                                           strict=True)]
    return Profiled(samples, _chrome_trace(prof))


def _timed_runs(session: Session, feeds: Feeds, runs: int) -> list[float]:
    walls = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        with record_function(_MARKER):
            session.run(feeds)
        walls.append((time.perf_counter_ns() - start) / 1e6)
    return walls


def _ops_under(marker: Any) -> tuple[OpTime, ...]:
    """The top-level ops of one run, named by op and their index among ops of that name."""
    seen: Counter[str] = Counter()
    ops = []
    for child in marker.cpu_children:
        ops.append(OpTime(f"{child.name}#{seen[child.name]}", child.name,
                          child.cpu_time_total / 1000.0))
        seen[child.name] += 1
    return tuple(ops)


def _chrome_trace(prof: profile) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="turboinfer-torch-trace-") as scratch:
        path = Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace: dict[str, Any] = json.loads(path.read_text())
    return trace

