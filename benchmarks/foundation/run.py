"""Engines side by side on builtin:resnet18 (FP32), in one run, with the machine.

    python benchmarks/foundation/run.py [--rounds 3] [--threads N]

Runs ``turboinfer bench`` ``--rounds`` times, interleaving the engines within each round
so that background noise falls on all of them alike, and keeps the median p50 per
(engine, batch size). Writes ``results.json`` beside this file and prints a Markdown
table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ENGINES = ("onnxruntime", "openvino", "torch")
BATCHES = "1,8"


def bench_once(engine: str, threads: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "turboinfer", "bench", "builtin:resnet18", "--engines", engine,
         "--batch-sizes", BATCHES, "--min-runs", "20", "--min-seconds", "3",
         "--threads", str(threads), "--json"],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: default)")
    args = parser.parse_args()
    rows: dict[tuple[str, int], list[dict]] = {}
    machine: dict = {}
    for _ in range(args.rounds):
        for engine in ENGINES:
            report = bench_once(engine, args.threads)
            machine = report["machine"]
            for row in report["results"]:
                rows.setdefault((row["engine"], row["batch_size"]), []).append(row)
    summary = []
    for (engine, batch), runs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        summary.append({
            "engine": engine, "batch_size": batch,
            "p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
            "qps": statistics.median(r["qps"] for r in runs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        })
    for batch in sorted({r["batch_size"] for r in summary}):
        ort = next(r for r in summary if r["engine"] == "onnxruntime" and r["batch_size"] == batch)
        for r in summary:
            if r["batch_size"] == batch:
                r["p50_vs_onnxruntime"] = r["p50_ms"] / ort["p50_ms"]
    result = {"model": "builtin:resnet18", "rounds": args.rounds, "threads": args.threads,
              "machine": machine, "results": summary}
    name = f"results-threads{args.threads}.json" if args.threads else "results.json"
    (Path(__file__).parent / name).write_text(json.dumps(result, indent=2) + "\n")
    print("| engine | batch | p50 ms | p99 ms | samples/s | p50 / ORT p50 | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for r in summary:
        print(f"| {r['engine']} | {r['batch_size']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['qps']:.1f} | {r['p50_vs_onnxruntime']:.2f} | {r['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
