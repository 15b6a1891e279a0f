"""Batch-1 decode on two of the runner's paths (llm/backends/torch/lean_decode.py), side by side.

``python benchmarks/llm/lean_decode.py [--rounds N] [--model DIR] [--a PATH --b PATH]``:
the paths are ``native`` (the whole step as one call into decode.c), ``lean`` (the lean
step over torch operations) and ``general`` (the packed-batch forward); A is ``lean`` and
B ``general`` unless given. The random 110M Llama (/work/peers/llm110m-gqa), a 64-token
prompt and 64 greedy tokens, one thread, fp32 / int8 / int4 loaded once each; every
round runs each format on A and B in ABBA order (A first in even rounds, B first in odd
ones) and keeps each side's faster run, so the ratios compare runs a second apart and a
one-off stall of the shared machine does not decide a round. Decode tok/s counts the
tokens after the first over the time after the first token. Writes lean_decode.json
next to this script (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from turboinfer.hardware.cpu import read_cpu
from turboinfer.llm import LLM, EngineConfig, SamplingParams

MODEL = Path("/work/peers/llm110m-gqa")
PROMPT_LEN, GEN = 64, 64


# path -> (runner.lean_decode, runner.native_decode)
PATHS = {"native": (True, True), "lean": (True, False), "general": (False, False)}


def run_once(llm: LLM, prompt: list[int], path: str) -> dict[str, Any]:
    runner = llm.engine.runner
    runner.lean_decode, runner.native_decode = PATHS[path]
    params = SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    total = time.perf_counter() - start
    decode_s = total - out.ttft_s
    return {"ids": list(out.token_ids), "total_s": total, "ttft_s": out.ttft_s,
            "decode_tps": (GEN - 1) / decode_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--a", choices=sorted(PATHS), default="lean")
    ap.add_argument("--b", choices=sorted(PATHS), default="general")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = ap.parse_args()
    pa, pb = args.a, args.b
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 32000, (PROMPT_LEN,), generator=gen).tolist()
    llms = {q: LLM(str(args.model), quant=q, config=EngineConfig(num_threads=1,
                                                                 kv_cache_tokens=16 * 1024))
            for q in ("none", "int8", "int4")}
    for llm in llms.values():           # warm-up: kernels, caches, allocator
        run_once(llm, prompt, pa)
        run_once(llm, prompt, pb)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        row: dict[str, Any] = {"load_before": os.getloadavg()}
        for q, llm in llms.items():
            a, b = (pa, pb) if r % 2 == 0 else (pb, pa)
            runs = [(path, run_once(llm, prompt, path)) for path in (a, b, b, a)]
            res = {p: max((x for on, x in runs if on == p), key=lambda x: x["decode_tps"])
                   for p in (pa, pb)}
            same = all(x["ids"] == runs[0][1]["ids"] for _, x in runs)
            row[q] = {f"{pa}_tps": res[pa]["decode_tps"], f"{pb}_tps": res[pb]["decode_tps"],
                      f"{pa}_total_s": res[pa]["total_s"], f"{pb}_total_s": res[pb]["total_s"],
                      "same_ids": same}
        row["load_after"] = os.getloadavg()
        rounds.append(row)
        print(json.dumps(row))
    summary = {}
    for q in llms:
        name = {"none": "fp32"}.get(q, q)
        ratios = [x[q][f"{pa}_tps"] / x[q][f"{pb}_tps"] for x in rounds]
        summary[name] = {
            f"{pa}_tps_median": statistics.median(x[q][f"{pa}_tps"] for x in rounds),
            f"{pb}_tps_median": statistics.median(x[q][f"{pb}_tps"] for x in rounds),
            "speedup_median": statistics.median(ratios),
            "speedup_min": min(ratios), "speedup_max": max(ratios),
            "same_ids_all_rounds": all(x[q]["same_ids"] for x in rounds),
        }
    loads = [v for x in rounds for v in (x["load_before"][0], x["load_after"][0])]
    results = {
        "command": (f"python benchmarks/llm/lean_decode.py --rounds {args.rounds} --a {pa} "
                    f"--b {pb}"),
        "machine": {"cpu": read_cpu().model_name, "cores": os.cpu_count(),
                    "torch": torch.__version__, "threads": 1},
        "workload": {"model": str(args.model), "prompt_tokens": PROMPT_LEN,
                     "generated_tokens": GEN, "batch": 1, "greedy": True},
        "load_average_1min": {"min": min(loads), "max": max(loads)},
        "summary": summary, "rounds": rounds,
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
