"""Batch-1 decode speed of several weight formats of one model, side by side in one process.

    python benchmarks/llm/quant_decode.py --model FILE.gguf|DIR [--quants int8 q8 int4]
        [--threads 1] [--rounds 5] [--gen-len 128]

Each format loads once (``LLM``: kernels, threads and prefetch distances measured at
load); then each round generates ``--gen-len`` tokens greedily (end of sequence ignored)
from the same 32-token prompt in every format, the order rotating by round. The rate is
tokens over the generate call's wall time (the prompt included). Writes ``--output``
(default ``quant_decode.json``) beside this script with the per-round rates, the medians,
each format's decode path and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from turboinfer.hardware import profile
from turboinfer.llm import LLM, EngineConfig, SamplingParams

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--quants", nargs="+", default=["int8", "q8", "int4"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--output", type=Path, default=HERE / "quant_decode.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    config = EngineConfig(num_threads=args.threads)
    engines = {q: LLM(args.model, quant=q, config=config) for q in args.quants}
    params = SamplingParams(max_tokens=args.gen_len, temperature=0, ignore_eos=True)
    prompt = list(range(100, 132))
    for llm in engines.values():
        llm.generate([prompt], params)                      # warm
    rates: dict[str, list[float]] = {q: [] for q in engines}
    for r in range(args.rounds):
        order = args.quants[r % len(args.quants):] + args.quants[:r % len(args.quants)]
        for quant in order:
            start = time.perf_counter()
            engines[quant].generate([prompt], params)
            rates[quant].append(args.gen_len / (time.perf_counter() - start))
        print({q: round(v[-1], 1) for q, v in rates.items()}, flush=True)
    hw = profile(engines=False, gpus=False)
    report = {
        "model": Path(args.model).name, "threads": torch.get_num_threads(),
        "gen_len": args.gen_len, "tokens_per_s": rates,
        "median_tokens_per_s": {q: statistics.median(v) for q, v in rates.items()},
        "decode_path": {q: e.engine.runner.decode_path() for q, e in engines.items()},
        "prefetch": {q: e.prefetch_choice.to_dict() if e.prefetch_choice else None
                     for q, e in engines.items()},
        "machine": {**hw.summary(), "python": platform.python_version()},
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "command": " ".join(["python", "benchmarks/llm/quant_decode.py", *sys.argv[1:]])}
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["median_tokens_per_s"]))


if __name__ == "__main__":
    main()
