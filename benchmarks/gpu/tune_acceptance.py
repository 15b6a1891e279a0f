"""GPU acceptance of tune: the device as one more axis of the search, in one run.

1. `turboinfer tune builtin:resnet50 --devices cpu,cuda` under a p99 SLO and a 1-point
   budget (top-1 agreement with FP32): CPU candidates (ONNX Runtime's variants, the
   torch module) beside GPU ones (the torch engine in TF32/FP16/BF16 with CUDA graphs,
   ONNX Runtime's CUDA/TensorRT providers when installed), every form judged on its
   device. Records which candidate won, its device and form, its throughput against the
   best CPU candidate's, and its in-process batch-1 p50 and batch-64 throughput against
   plain torch done by hand (FP16 + channels_last + a CUDA graph, pinned copies; the
   reference of serve_acceptance.py), timed host to host in the same run.
2. `turboinfer serve` of the entry tune wrote, exactly as written, driven by `turboinfer
   load --scenario concurrency` at 1 and 32 clients: the served p50 and throughput.
3. Every figure printed, and one JSON written (--out).

On the GPU machine, with the wheels installed as serve_acceptance.py's header says:

    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/gpu/tune_acceptance.py \\
        --out benchmarks/gpu/tune_acceptance.json             # about 3-4 minutes

On a CPU (the same code paths, smaller): PYTHONPATH=src python
benchmarks/gpu/tune_acceptance.py --device cpu --quick (builtin:digits-cnn, the torch
engine's CPU forms beside ONNX Runtime, batch 1 and 8, 1 and 8 clients; about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from serve_acceptance import bench_reference, drive, serving  # the script's own folder

from turboinfer.hardware import profile
from turboinfer.models import resolve_model


def run_tune(model: str, repo: Path, devices: str, slo_ms: float, batches: list[int],
             threads: int, engines: str | None, variants: str) -> dict[str, Any]:
    """The real command line; returns its report.json."""
    command = [sys.executable, "-m", "turboinfer", "tune", model, "-o", str(repo),
               "--devices", devices, "--slo-p99-ms", str(slo_ms), "--max-accuracy-drop", "1",
               "--batch-sizes", ",".join(map(str, batches)), "--threads", str(threads),
               "--variants", variants]
    if engines:
        command += ["--engines", engines]
    print("$ " + " ".join(command[1:]), flush=True)
    done = subprocess.run(command, text=True, stdout=subprocess.PIPE)
    print(done.stdout, flush=True)
    if done.returncode not in (0, 3):  # 3: no candidate met the SLO (still reported)
        raise SystemExit(f"tune failed with exit code {done.returncode}")
    name = model.split(":", 1)[-1]
    return dict(json.loads((repo / name / "tune" / "report.json").read_text()))


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """The winner, its device and form, and its throughput against the best CPU one."""
    chosen = report["chosen"]
    if chosen is None:
        return {"chosen": None}
    cpu = [c for c in report["candidates"] if c["device"] == "cpu" and c["eligible"]]
    best_cpu = max(cpu, key=lambda c: c["plan"]["qps"]) if cpu else None
    curve = {p["batch_size"]: p for p in chosen["curve"]}
    qps = chosen["plan"]["qps"]
    return {
        "chosen": chosen["label"], "device": chosen["device"],
        "placement": chosen["placement"], "metric": chosen["metric"],
        "within_budget": chosen["within_budget"], "eligible": chosen["eligible"],
        "plan": chosen["plan"], "rule": (chosen.get("decision") or {}).get("rule"),
        "curve_p50_ms": {b: p["p50_ms"] for b, p in curve.items()},
        "curve_qps": {b: p["qps"] for b, p in curve.items()},
        "best_cpu": None if best_cpu is None else best_cpu["label"],
        "best_cpu_qps": None if best_cpu is None else best_cpu["plan"]["qps"],
        "ratio_to_best_cpu": None if best_cpu is None else qps / best_cpu["plan"]["qps"],
        "gpu_candidates": [{"label": c["label"], "metric": c["metric"],
                            "within_budget": c["within_budget"], "error": c["error"],
                            "qps": (c["plan"] or {}).get("qps")}
                           for c in report["candidates"] if c["device"] != "cpu"],
        "notes": report["notes"],
    }


def against_reference(summary: dict[str, Any], reference: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    """The chosen candidate's tune figures against plain torch, per batch size both have:
    p50 ratio (lower is better) and throughput ratio (higher is better)."""
    out = []
    for ref in reference:
        batch = ref["batch_size"]
        p50 = summary.get("curve_p50_ms", {}).get(batch)
        qps = summary.get("curve_qps", {}).get(batch)
        if p50 is None or qps is None:
            continue
        out.append({"batch_size": batch, "p50_ratio": p50 / ref["p50_ms"],
                    "throughput_ratio": qps / (batch / ref["p50_ms"] * 1e3)})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true",
                        help="small: builtin:digits-cnn, batch 1 and 8, 1 and 8 clients")
    parser.add_argument("--model", default=None, help="default: builtin:resnet50")
    parser.add_argument("--slo-p99-ms", type=float, default=None,
                        help="default 50 (resnet50), 20 with --quick")
    parser.add_argument("--variants", default="graph,int8-dynamic",
                        help="ONNX variants built for the CPU candidates (default: "
                             "graph,int8-dynamic: quick to build, one INT8 among them)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU candidates' intra-op threads (default: every core; 1 "
                             "with --quick, where the cores are often shared)")
    parser.add_argument("--clients", default=None, help="comma list (default 1,32)")
    parser.add_argument("--out", type=Path, default=Path("tune_acceptance.json"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: --device cuda, but this torch ({torch.__version__}) sees no GPU; "
              "use --device cpu", file=sys.stderr)
        return 2
    started = time.perf_counter()
    model_ref = args.model or ("builtin:digits-cnn" if args.quick else "builtin:resnet50")
    batches = [1, 8] if args.quick else [1, 8, 64]
    clients = [int(c) for c in (args.clients or ("1,8" if args.quick else "1,32")).split(",")]
    slo = args.slo_p99_ms or (20.0 if args.quick else 50.0)
    devices = "cpu,cuda" if args.device == "cuda" else "cpu"
    # On the CPU the torch engine is named, so its CPU forms (BF16, channels_last) are
    # searched beside ONNX Runtime's; on a GPU its GPU forms are searched in any case.
    engines = "onnxruntime,torch" if args.device == "cpu" else None
    machine = profile().summary()
    print(f"tune {model_ref} on {devices}; {machine}", flush=True)
    result: dict[str, Any] = {"model": model_ref, "devices": devices, "slo_p99_ms": slo,
                              "torch": torch.__version__, "machine": machine,
                              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda"
                              else None}
    with tempfile.TemporaryDirectory(prefix="tune-acceptance-") as tmp:
        work = Path(tmp)
        tune_started = time.perf_counter()
        report = run_tune(model_ref, work / "repo", devices, slo, batches,
                          args.threads or (1 if args.quick else os.cpu_count() or 1),
                          engines, args.variants)
        result["tune_seconds"] = round(time.perf_counter() - tune_started, 1)
        summary = summarise(report)
        result["tune"] = summary
        print(f"chosen {summary['chosen']} on {summary.get('device')}: "
              f"{summary.get('ratio_to_best_cpu') or float('nan'):.2f}x the throughput of "
              f"the best CPU candidate ({summary.get('best_cpu')})", flush=True)
        print("reference (plain torch, host to host, after warm-up):", flush=True)
        model = resolve_model(model_ref)
        reference = bench_reference(model, args.device, [batches[0], batches[-1]],
                                    0.5 if args.quick else 2.0)
        result["reference"] = reference
        result["against_reference"] = against_reference(summary, reference)
        for line in result["against_reference"]:
            print(f"  tuned / reference, batch {line['batch_size']}: p50 "
                  f"{line['p50_ratio']:.2f}x, throughput {line['throughput_ratio']:.2f}x",
                  flush=True)
        if summary["chosen"] is not None and report.get("entry"):
            name = Path(report["entry"]).parent.name
            entry_config = (work / "repo" / name / "config.yaml").read_text()
            result["entry_config"] = entry_config
            print(f"serving the written entry:\n{entry_config}", flush=True)
            with serving(work / "repo", work / "server.log") as url:
                result["served"] = drive(url, name, clients, "1s" if args.quick else "2s",
                                         work)
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out} after {result['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
