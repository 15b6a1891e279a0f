"""The general path's native kernels solo (on the calling thread, the workers asleep) against
on the workers, in one process, interleaved: a prompt's time to first token and 8
sequences' prefill plus decode.

    python benchmarks/llm/solo_prefill.py --model FILE.gguf|DIR [--quant int8 int4 none]
        [--threads 2] [--rounds 4]

Per format the model loads once; each round, both ways (the one that goes first
alternating): 8 new 128-token prompts generate 64 tokens each (greedy, end of sequence
ignored), then one new 128-token prompt generates one token (its time is the TTFT).
Prompts are new every time, so the prefix cache never serves them. "workers" is the
runner without its solo switch (``ModelRunner._library = None``). Writes ``--output``
(default ``solo_prefill.json``) beside this script.
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
    parser.add_argument("--quant", nargs="+", default=["int8", "int4", "none"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--output", type=Path, default=HERE / "solo_prefill.json")
    args = parser.parse_args()
    library = native_status().library
    if library is None:
        sys.exit(f"native kernels absent: {native_status().reason}")
    load_before = os.getloadavg()
    counter = [0]

    def prompts(n: int) -> list[list[int]]:
        counter[0] += 1
        return [[100 + (7 * j + 13 * i + 31 * counter[0]) % 4000 for j in range(128)]
                for i in range(n)]

    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    first = SamplingParams(max_tokens=1, temperature=0)
    results = {}
    for quant in args.quant:
        llm = LLM(args.model, quant=quant, config=EngineConfig(num_threads=args.threads))
        runner = llm.engine.runner
        llm.generate(prompts(8), params)                    # warm
        rates: dict[str, list[float]] = {"solo": [], "workers": []}
        ttft: dict[str, list[float]] = {"solo": [], "workers": []}
        for r in range(args.rounds):
            for label in ("solo", "workers") if r % 2 == 0 else ("workers", "solo"):
                runner._library = library if label == "solo" else None
                library.set_solo(False)
                start = time.perf_counter()
                llm.generate(prompts(8), params)
                rates[label].append(8 * 64 / (time.perf_counter() - start))
                start = time.perf_counter()
                llm.generate(prompts(1), first)
                ttft[label].append(1e3 * (time.perf_counter() - start))
        runner._library = library
        results[quant] = {
            "tokens_per_s_8": rates, "ttft_ms": ttft,
            "ratio_8": statistics.median(
                a / b for a, b in zip(rates["solo"], rates["workers"], strict=True)),
            "ttft_ratio": statistics.median(ttft["workers"]) / statistics.median(ttft["solo"])}
        print(quant, {k: round(v, 3) for k, v in results[quant].items()
                      if k.endswith("ratio") or k == "ratio_8"}, flush=True)
    hw = profile(engines=False, gpus=False)
    report = {"model": Path(args.model).name, "threads": args.threads, "results": results,
              "machine": {**hw.summary(), "python": platform.python_version()},
              "load_average": {"before": load_before, "after": os.getloadavg()},
              "command": " ".join(["python", "benchmarks/llm/solo_prefill.py", *sys.argv[1:]])}
    args.output.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
