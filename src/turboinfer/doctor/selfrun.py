"""``doctor MODEL``: a quick bench at two batch sizes and two thread counts, with this
machine sampled around it, so the rules have a curve and a thread comparison to read."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from turboinfer.bench.latency import BenchConfig
from turboinfer.bench.sweep import run_bench
from turboinfer.doctor.machine import MachineWindow, sample, window
from turboinfer.engines import EngineSettings
from turboinfer.models import resolve_model


@dataclass(frozen=True)
class SelfRunSettings:
    batch_sizes: tuple[int, int] = (1, 8)
    threads: tuple[int, ...] = (1, 2)
    engine: str = "onnxruntime"
    seconds: float = 0.3          # per point: a look, not a measurement to decide on
    min_runs: int = 20


def self_run(model_ref: str, settings: SelfRunSettings, *, root: Path = Path("/")
             ) -> tuple[dict[str, Any], MachineWindow]:
    """A bench-shaped report whose rows carry their ``threads``, and the machine window."""
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
    machine = window(before, sample(root), time.monotonic() - started, root)
    return {"model": model.name, "results": rows, "skipped": skipped}, machine
