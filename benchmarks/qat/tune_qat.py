"""``tune`` with QAT on digits-dsconv, where every post-training calibration misses the budget.

    python benchmarks/qat/tune_qat.py [--budget 0.5] [--out benchmarks/qat/tune_qat.json]

One ``tune`` run (ONNX Runtime, batch sizes 1-32, the default timing rounds) over
int8-static (MinMax, Entropy, Percentile), the mixed-precision model PTQ needs to meet
the budget, and the QAT model; the JSON keeps each variant's metric and each candidate's
best throughput within the SLO, so the ratios are from one run, side by side.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

from turboinfer.optimize import tune


def _planned_qps(candidate: dict[str, Any]) -> float:
    """The throughput ``tune`` planned for a candidate (its batch size within the SLO)."""
    return float((candidate.get("plan") or {}).get("qps") or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", default="0.5")
    parser.add_argument("--slo-p99-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("tune_qat.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = tune("builtin:digits-dsconv", Path(tmp), slo_p99_ms=args.slo_p99_ms,
                      max_accuracy_drop=args.budget, engines=["onnxruntime"],
                      variants=["int8-static", "qat"]).to_dict()
    variants = {v["name"]: {"metric": v["metric"], "delta": v["delta"],
                            "within_budget": v["within_budget"]}
                for v in report["optimize"]["variants"]}
    best: dict[str, dict[str, Any]] = {}
    for c in report["candidates"]:
        key = c.get("variant_name") or c.get("variant")
        if key not in best or _planned_qps(c) > _planned_qps(best[key]):
            best[key] = c
    out = {"model": "builtin:digits-dsconv", "budget": args.budget,
           "slo_p99_ms": args.slo_p99_ms, "chosen": report["chosen"], "variants": variants,
           "best_candidate_per_variant": best, "notes": report["notes"],
           "machine": report["machine"], "load_average": os.getloadavg(),
           "elapsed_s": report["elapsed_s"]}
    args.out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    chosen = report["chosen"] or {}
    print("chosen:", {k: chosen.get(k) for k in ("variant", "engine", "threads")},
          "planned qps", round(_planned_qps(chosen)))
    for name, c in best.items():
        print(f"{name:<24} best candidate {c['label']}: planned qps {_planned_qps(c):,.0f}")
    for name, row in variants.items():
        print(f"{name:<24} {row}")


if __name__ == "__main__":
    main()
