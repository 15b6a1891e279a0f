"""``doctor MODEL``: a quick bench at two batch sizes and two thread counts, with this
machine sampled around it, so the rules have a curve and a thread comparison to read,
and a short profile, so the framework-overhead and QDQ rules have shares to read."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from turboinfer.bench.latency import BenchConfig
from turboinfer.bench.sweep import run_bench
from turboinfer.doctor.machine import MachineWindow, sample, window
from turboinfer.engines import EngineSettings
from turboinfer.errors import TurboinferError
from turboinfer.models import ResolvedModel, resolve_model
from turboinfer.profile import ProfileSettings, run_profile


@dataclass(frozen=True)
class SelfRunSettings:
    batch_sizes: tuple[int, int] = (1, 8)
    threads: tuple[int, ...] = (1, 2)
    engine: str = "onnxruntime"
    seconds: float = 0.3          # per point: a look, not a measurement to decide on
    min_runs: int = 20
    profile_runs: int = 20        # enough for operator shares; the profile is a look too


@dataclass(frozen=True)
class SelfRun:
    bench: dict[str, Any]            # bench-shaped: rows carry their ``threads``
    profile: dict[str, Any] | None   # profile-shaped; None when the engine has no profiler
    machine: MachineWindow
    notes: tuple[str, ...] = ()


def self_run(model_ref: str, settings: SelfRunSettings, *, root: Path = Path("/")) -> SelfRun:
    """Bench, then profile, with the machine sampled around both."""
    model = resolve_model(model_ref)
    config = BenchConfig(engines=(settings.engine,), batch_sizes=settings.batch_sizes,
                         min_runs=settings.min_runs, min_seconds=settings.seconds)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    started, before = time.monotonic(), sample(root)
    for threads in settings.threads:
        report = run_bench(model, replace(config, settings=EngineSettings(
            intra_op_threads=threads)))
        rows += [{**r.to_dict(), "threads": threads} for r in report.results]
        skipped += [{**s.to_dict(), "threads": threads} for s in report.skipped]
    profile, notes = _profile(model, settings)
    machine = window(before, sample(root), time.monotonic() - started, root)
    return SelfRun({"model": model.name, "results": rows, "skipped": skipped}, profile,
                   machine, notes)


def _profile(model: ResolvedModel, settings: SelfRunSettings
             ) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """A short profile at batch 1 on the self-run's engine, engine-chosen threads. A
    profiler that cannot run this model costs the profile rules only, not the bench."""
    try:
        report = run_profile(model, ProfileSettings(
            engine=settings.engine, runs=settings.profile_runs, warmup_runs=3))
    except TurboinferError as exc:
        return None, (f"no profile: {exc}",)
    return report.to_dict(), ()
