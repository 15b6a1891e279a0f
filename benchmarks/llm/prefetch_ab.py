"""Batch-1 decode with the prefetch distances chosen at load against 256 bytes for every
kernel family (the fixed distance before), in one process, interleaved.

    python benchmarks/llm/prefetch_ab.py --model FILE.gguf [--quant int4] [--threads 1 2]
        [--rounds 5] [--gen-len 128]

Per thread count the model loads once (``LLM``; the load measures the distances, recorded
with their timings); then each round generates ``--gen-len`` tokens greedily (end of
sequence ignored) from a 32-token prompt at both settings, the one that goes first
alternating. The rate is tokens over the generate call's wall time (the prompt included).
Writes ``--output`` (default ``prefetch_ab.json``) beside this script.
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

from turboinfer.hardware import profile
from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.backends.cpu.native import native_status

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--quant", default="int4")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--output", type=Path, default=HERE / "prefetch_ab.json")
    args = parser.parse_args()
    library = native_status().library
    if library is None:
        sys.exit(f"native kernels absent: {native_status().reason}")
    load_before = os.getloadavg()
    params = SamplingParams(max_tokens=args.gen_len, temperature=0, ignore_eos=True)
    prompt = list(range(100, 132))
    runs = []
    for threads in args.threads:
        llm = LLM(args.model, quant=args.quant, config=EngineConfig(num_threads=threads))
        choice = llm.prefetch_choice
        if choice is None:
            sys.exit("no prefetching native kernel at one row: nothing to compare")

        def settle(label: str, chosen: dict[str, int] = choice.chosen) -> None:
            if label == "256":
                library.set_prefetch(256)
            else:
                for kind, distance in chosen.items():
                    library.set_prefetch(distance, kind)

        rates: dict[str, list[float]] = {"256": [], "chosen": []}
        llm.generate([prompt], params)                     # warm
        for r in range(args.rounds):
            for label in ("256", "chosen") if r % 2 == 0 else ("chosen", "256"):
                settle(label)
                start = time.perf_counter()
                llm.generate([prompt], params)
                rates[label].append(args.gen_len / (time.perf_counter() - start))
        settle("chosen")
        ratios = [c / b for c, b in zip(rates["chosen"], rates["256"], strict=True)]
        runs.append({"threads": threads, "prefetch": choice.to_dict(),
                     "tokens_per_s": rates, "ratio_median": statistics.median(ratios),
                     "ratio_min": min(ratios), "ratio_max": max(ratios)})
        print(json.dumps(runs[-1]), flush=True)
    hw = profile(engines=False, gpus=False)
    report = {"model": Path(args.model).name, "quant": args.quant, "gen_len": args.gen_len,
              "runs": runs,
              "machine": {**hw.summary(), "python": platform.python_version()},
              "load_average": {"before": load_before, "after": os.getloadavg()},
              "command": " ".join(["python", "benchmarks/llm/prefetch_ab.py", *sys.argv[1:]])}
    args.output.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
