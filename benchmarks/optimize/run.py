"""Acceptance numbers of the optimizer, measured side by side in one run.

    python benchmarks/optimize/run.py [--out benchmarks/optimize/results.json]

- resnet50: int8-static (QDQ, per-channel, measured activation type) vs ONNX Runtime FP32
  and torch eager, batch 1, median p50 over interleaved rounds.
- minilm: int8-dynamic vs ONNX Runtime FP32 at sequence length 128, and the mean cosine
  of its embeddings to the FP32 ones (the zoo metric).
- digits-cnn: int8-static accuracy per calibration method vs FP32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from turboinfer.bench.latency import time_runs
from turboinfer.bench.stats import summarize_ns
from turboinfer.engines import EngineSettings, ModelArtifact, load_session
from turboinfer.hardware import profile
from turboinfer.models import resolve_model
from turboinfer.optimize import optimize

ROUNDS = 7


def interleaved(model: Any, files: dict[str, tuple[str, ModelArtifact]]) -> dict[str, Any]:
    """Median of per-round p50 (and p99) at batch 1, the candidates alternating each round."""
    feeds = model.entry.example_inputs(1)
    sessions = {key: load_session(art, engine, EngineSettings())
                for key, (engine, art) in files.items()}
    p50: dict[str, list[float]] = {key: [] for key in files}
    p99: dict[str, list[float]] = {key: [] for key in files}
    for _ in range(ROUNDS):
        for key, session in sessions.items():
            stats = summarize_ns(time_runs(session.run, feeds, min_runs=20, min_seconds=1.0,
                                           warmup_runs=3))
            p50[key].append(stats.p50_ms)
            p99[key].append(stats.p99_ms)
    return {key: {"p50_ms": statistics.median(p50[key]), "p99_ms": statistics.median(p99[key])}
            for key in files}


def resnet50(work: Path) -> dict[str, Any]:
    model = resolve_model("builtin:resnet50")
    report = optimize(model, work / "resnet50", variants=["int8-static"],
                      calibrations=["minmax"], calib_count=64)
    int8 = report.get("int8-static-minmax")
    assert int8.path is not None
    timing = interleaved(model, {
        "ort_fp32": ("onnxruntime", model.artifact),
        "ort_int8_static": ("onnxruntime", ModelArtifact("int8", int8.path)),
        "torch_eager": ("torch", model.artifact),
    })
    base = timing["ort_int8_static"]["p50_ms"]
    return {"latency": timing,
            "speedup_vs_ort_fp32": timing["ort_fp32"]["p50_ms"] / base,
            "speedup_vs_torch_eager": timing["torch_eager"]["p50_ms"] / base,
            "activation_type": report.activation.to_dict() if report.activation else None,
            "top1_agreement_int8": int8.metric, "note": "random weights: metric is agreement"}


def minilm(work: Path) -> dict[str, Any]:
    model = resolve_model("builtin:minilm")
    report = optimize(model, work / "minilm", variants=["int8-dynamic"])
    dyn = report.get("int8-dynamic")
    assert dyn.path is not None
    timing = interleaved(model, {
        "ort_fp32": ("onnxruntime", model.artifact),
        "ort_int8_dynamic": ("onnxruntime", ModelArtifact("int8", dyn.path)),
    })
    return {"latency": timing,
            "speedup_vs_ort_fp32": timing["ort_fp32"]["p50_ms"]
            / timing["ort_int8_dynamic"]["p50_ms"],
            "metric": report.metric.name if report.metric else None,
            "fp32_metric": report.reference.metric, "int8_dynamic_metric": dyn.metric}


def digits(work: Path) -> dict[str, Any]:
    report = optimize("builtin:digits-cnn", work / "digits", variants=["int8-static"])
    rows = {v.name: {"accuracy": v.metric, "delta": v.delta} for v in report.variants}
    return {"accuracy": rows,
            "activation_type": report.activation.to_dict() if report.activation else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results = {"machine": profile().summary(), "digits-cnn": digits(work),
                   "minilm": minilm(work), "resnet50": resnet50(work)}
    results["elapsed_s"] = round(time.time() - started)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
