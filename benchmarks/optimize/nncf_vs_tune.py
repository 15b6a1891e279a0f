"""Is the configuration ``tune`` picks at least as fast as OpenVINO's own INT8 (NNCF)?

    python benchmarks/optimize/nncf_vs_tune.py [--budget 15] [--out FILE.json]

1. ``tune`` on builtin:resnet18, engines onnxruntime and openvino, batch 1, variants
   int8-static (MinMax calibration only, to bound the run; the NNCF variants join because
   openvino is an engine), the budget and SLO below. The same search from the command
   line: ``turboinfer tune builtin:resnet18 --engines onnxruntime,openvino --batch-sizes 1
   --variants int8-static --calib-count 300 --slo-p99-ms 200 --max-accuracy-drop B -o R``.
   The weights are random and the metric is top-1 agreement with FP32 on 64 images (one
   image is 1.56 points): a budget of 5 excludes NNCF's full INT8, one of 15 admits it.
2. In the same process, side by side in interleaved rounds at batch 1: the chosen
   configuration (its file, engine and threads), OpenVINO + NNCF INT8 as a user would
   make it (``nncf.quantize``, default preset, 300 calibration samples, all cores),
   OpenVINO FP32 and ONNX Runtime FP32 (all cores).
3. Median over rounds of each round's p50 and p99, with the rounds' interval; the JSON
   also holds tune's candidates table and the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import nncf
import numpy as np
import openvino as ov

from turboinfer.bench.latency import time_runs
from turboinfer.bench.stats import spread, summarize_ns
from turboinfer.engines import EngineSettings, ModelArtifact, load_session
from turboinfer.models import resolve_model
from turboinfer.optimize.search.tuning import run_tune
from turboinfer.optimize.settings import (
    CalibrationMethod,
    tune_optimize_settings,
    tune_settings_from,
)

MODEL = "builtin:resnet18"
SLO_MS, CALIB = 200.0, 300
ROUNDS, WINDOW_S, WINDOW_RUNS = 9, 1.0, 20
CORES = os.cpu_count() or 1


def run_tune_step(repo: Path, budget: str) -> Any:
    built = replace(tune_optimize_settings(max_accuracy_drop=budget, variants=["int8-static"],
                                           calib_count=CALIB),
                    calibrations=(CalibrationMethod.MINMAX,))
    search = tune_settings_from(slo_p99_ms=SLO_MS, engines=["onnxruntime", "openvino"],
                                batch_sizes=[1])
    return run_tune(MODEL, repo, built, search,
                    lambda line: print(f"  tune: {line}", flush=True))


def nncf_int8(model: Any, out: Path) -> Path:
    """What OpenVINO's documentation shows: read the ONNX file, quantize, save IR."""
    samples = model.entry.calibration(CALIB)["input"]
    dataset = nncf.Dataset([samples[i:i + 1] for i in range(len(samples))])
    quantized = nncf.quantize(ov.Core().read_model(str(model.artifact.onnx_path)), dataset,
                              subset_size=CALIB)
    path = out / "resnet18-nncf-int8.xml"
    ov.save_model(quantized, str(path))
    return path


def interleaved(configs: dict[str, tuple[str, Path, int]], feeds: dict[str, np.ndarray]
                ) -> dict[str, Any]:
    sessions = {key: load_session(ModelArtifact(key, path), engine,
                                  EngineSettings(intra_op_threads=threads))
                for key, (engine, path, threads) in configs.items()}
    p50: dict[str, list[float]] = {key: [] for key in configs}
    p99: dict[str, list[float]] = {key: [] for key in configs}
    for number in range(ROUNDS):
        keys = list(sessions)
        keys = keys[number % len(keys):] + keys[:number % len(keys)]  # rotate the order
        for key in keys:
            stats = summarize_ns(time_runs(sessions[key].run, feeds, min_runs=WINDOW_RUNS,
                                           min_seconds=WINDOW_S, warmup_runs=3))
            p50[key].append(stats.p50_ms)
            p99[key].append(stats.p99_ms)
        print(f"  round {number + 1}/{ROUNDS}: "
              + ", ".join(f"{k} {p50[k][-1]:.2f}" for k in configs), flush=True)
    return {key: {"engine": configs[key][0], "threads": configs[key][2],
                  "file": configs[key][1].name, "p50_ms": spread(p50[key]).to_dict(),
                  "p99_ms": spread(p99[key]).to_dict(), "rounds_p50_ms": p50[key]}
            for key in configs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", default="15", help="--max-accuracy-drop for tune")
    parser.add_argument("--out", default=None, help="default: nncf_vs_tune-budgetB.json here")
    args = parser.parse_args()
    out = args.out or str(Path(__file__).with_name(f"nncf_vs_tune-budget{args.budget}.json"))
    load_before, started = os.getloadavg(), time.time()
    model = resolve_model(MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("tune", flush=True)
        report = run_tune_step(work / "repo", args.budget)
        best = report.best
        assert best is not None
        print(f"chosen: {best.candidate.label}; building NNCF INT8 as a user would",
              flush=True)
        configs = {
            "tune_choice": (best.candidate.engine, best.candidate.path, best.candidate.threads),
            "openvino_nncf_int8": ("openvino", nncf_int8(model, work), CORES),
            "openvino_fp32": ("openvino", model.artifact.onnx_path, CORES),
            "onnxruntime_fp32": ("onnxruntime", model.artifact.onnx_path, CORES),
        }
        timing = interleaved(configs, model.entry.example_inputs(1))
        tuned = report.to_dict()
    print(json.dumps(summary(timing, tuned, load_before, started, out), indent=1))


def summary(timing: dict[str, Any], tuned: dict[str, Any], load_before: tuple[float, ...],
            started: float, out: str) -> dict[str, Any]:
    chosen, reference = timing["tune_choice"], timing["openvino_nncf_int8"]
    result = {
        "model": MODEL, "batch_size": 1, "slo_p99_ms": SLO_MS,
        "max_accuracy_drop": tuned["max_accuracy_drop"],
        "calibration_samples": CALIB, "rounds": ROUNDS, "window_s": WINDOW_S,
        "chosen": tuned["chosen"]["label"], "timing": timing,
        "chosen_over_nncf_p50": chosen["p50_ms"]["median"] / reference["p50_ms"]["median"],
        "chosen_clearly_slower_than_nncf": chosen["p50_ms"]["low"] > reference["p50_ms"]["high"],
        "variants": [{k: v.get(k) for k in ("name", "metric", "delta", "within_budget",
                                            "p50_ms", "skipped")}
                     for v in tuned["optimize"]["variants"]],
        "candidates": [{"label": c["label"], "plan": c["plan"], "error": c["error"]}
                       for c in tuned["candidates"]],
        "decision": tuned["chosen"]["decision"],
        "machine": {**tuned["machine"], "cpu": cpu_model(), "python": platform.python_version(),
                    "openvino": ov.__version__, "nncf": nncf.__version__},
        "load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
        "elapsed_s": round(time.time() - started, 1),
    }
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    return {k: result[k] for k in ("chosen", "chosen_over_nncf_p50",
                                   "chosen_clearly_slower_than_nncf", "load_average_before",
                                   "load_average_after", "elapsed_s")}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
