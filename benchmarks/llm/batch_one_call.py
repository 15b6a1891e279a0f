"""Several sequences decoding together: the batched step as one call into C against the
same step looped from Python (``BatchDecoder.native_steps``), in one process, interleaved.

    python benchmarks/llm/batch_one_call.py --model FILE.gguf|DIR [--quant int8]
        [--threads 2] [--batch 8] [--rounds 5] [--gen-len 64]

The model loads once; each round generates ``--gen-len`` tokens greedily (end of sequence
ignored) for ``--batch`` 32-token prompts at once, both ways, the one that goes first
alternating. The rate is the batch's tokens over the generate call's wall time (the
prompts' prefill included, the same on both sides). Writes ``--output`` (default
``batch_one_call.json``) beside this script.
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

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--quant", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--output", type=Path, default=HERE / "batch_one_call.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    llm = LLM(args.model, quant=args.quant, config=EngineConfig(num_threads=args.threads))
    prompts = [list(range(100 + i, 132 + i)) for i in range(args.batch)]
    params = SamplingParams(max_tokens=args.gen_len, temperature=0, ignore_eos=True)
    llm.generate(prompts, params)                          # warm; builds the decoders
    decoder = llm.engine.runner._batched()
    if decoder is None or decoder._native_layers(args.batch) is None:
        sys.exit("no native batched step for this model and batch")
    rates: dict[str, list[float]] = {"one_call": [], "python_loop": []}
    for r in range(args.rounds):
        for label in ("one_call", "python_loop") if r % 2 == 0 else ("python_loop", "one_call"):
            decoder.native_steps = label == "one_call"
            start = time.perf_counter()
            llm.generate(prompts, params)
            rates[label].append(args.batch * args.gen_len / (time.perf_counter() - start))
    ratios = [a / b for a, b in zip(rates["one_call"], rates["python_loop"], strict=True)]
    hw = profile(engines=False, gpus=False)
    report = {"model": Path(args.model).name, "quant": args.quant, "threads": args.threads,
              "batch": args.batch, "gen_len": args.gen_len, "tokens_per_s": rates,
              "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
              "ratio_max": max(ratios),
              "machine": {**hw.summary(), "python": platform.python_version()},
              "load_average": {"before": load_before, "after": os.getloadavg()},
              "command": " ".join(["python", "benchmarks/llm/batch_one_call.py",
                                   *sys.argv[1:]])}
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("ratio_median", "ratio_min", "ratio_max")}))


if __name__ == "__main__":
    main()
