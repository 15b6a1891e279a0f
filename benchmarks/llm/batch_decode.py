"""Batch 16 with and without the batched native decode step (llm/backends/cpu/batch_decode.py).

``python benchmarks/llm/batch_decode.py [--rounds N] [--model DIR]``: the random 110M
Llama (/work/peers/llm110m-gqa) of compare.py, 16 prompts of 64 tokens submitted at once
(continuous batching), 64 greedy tokens each, one thread, fp32 and int8 loaded once each.
Every round draws 16 new prompts and runs each format with the batched step on and off
(``ModelRunner.batch_decode``) in ABBA order (A first in even rounds, B first in odd
ones), keeping each side's faster run, so the ratios compare runs seconds apart and a
one-off stall of the shared machine does not decide a round. The four runs of a round
feed the same prompts with prefix caching off, so each run prefills all 1024 prompt
tokens (as compare.py's fresh prompts do) and the greedy ids of the two paths can be
compared. tok/s: generated tokens over the wall time of the whole call, prefill
included (compare.py's batch-16 figure); decode tok/s: the tokens after each request's
first over the time after the last first token. Also the quality of each path: the
perplexity of the trained demo model on its held-out text (int8 and fp32) with every
token fed through decode steps of 16 sequences at once. Writes batch_decode.json next to
this script.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from turboinfer.hardware.cpu import read_cpu
from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.api import demo_model_dir
from turboinfer.llm.backends.base import StepItem

MODEL = Path("/work/peers/llm110m-gqa")
BATCH, PROMPT_LEN, GEN = 16, 64, 64
PPL_LEN = 128               # tokens per sequence in the decode-step perplexity


def decode_perplexity(llm: LLM, batched: bool) -> float:
    """exp(mean next-token cross-entropy) of 16 held-out sequences, every position one
    decode step of all 16 (teacher forcing, each sequence on its own blocks)."""
    runner = llm.engine.runner
    runner.batch_decode = batched
    ids = llm.tokenizer.encode((demo_model_dir().parent / "heldout.txt").read_text())
    rows = [ids[i * (PPL_LEN + 1):(i + 1) * (PPL_LEN + 1)] for i in range(BATCH)]
    per = -(-PPL_LEN // runner.block_size)
    tables = [list(range(i * per, (i + 1) * per)) for i in range(BATCH)]
    total = 0.0
    for p in range(PPL_LEN):
        logits = runner.run([StepItem([r[p]], p, t, 1) for r, t in zip(rows, tables,
                                                                      strict=True)])
        targets = torch.tensor([r[p + 1] for r in rows])
        total += float(F.cross_entropy(logits, targets, reduction="sum"))
    assert runner.batch_decode == batched, "the batched step could not be built"
    return math.exp(total / (BATCH * PPL_LEN))


def run_once(llm: LLM, prompts: list[list[int]], batched: bool) -> dict[str, Any]:
    runner = llm.engine.runner
    runner.batch_decode = batched
    params = SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    total = time.perf_counter() - start
    # ttft_s counts from arrival, which is the call's start for all 16 requests.
    decode_s = total - max(o.ttft_s for o in outs)
    assert runner.batch_decode == batched, "the batched step could not be built"
    return {"ids": [list(o.token_ids) for o in outs], "total_s": total,
            "tps": BATCH * GEN / total, "decode_tps": BATCH * (GEN - 1) / decode_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)

    def prompts() -> list[list[int]]:
        return [torch.randint(3, 32000, (PROMPT_LEN,), generator=gen).tolist()
                for _ in range(BATCH)]

    ppl: dict[str, dict[str, float]] = {}
    for q in ("none", "int8"):
        demo = LLM(None, quant=q, config=EngineConfig(num_threads=1, kv_cache_tokens=4096))
        ppl[{"none": "fp32"}.get(q, q)] = {"batched": decode_perplexity(demo, True),
                                           "general": decode_perplexity(demo, False)}
        del demo
    print(json.dumps({"decode_perplexity": ppl}), flush=True)
    config = EngineConfig(num_threads=1, kv_cache_tokens=16 * 1024,
                          enable_prefix_caching=False)
    llms = {q: LLM(str(args.model), quant=q, config=config) for q in ("none", "int8")}
    warm = prompts()
    for llm in llms.values():           # warm-up: kernels, caches, allocator
        run_once(llm, warm, True)
        run_once(llm, warm, False)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        row: dict[str, Any] = {"load_before": os.getloadavg()}
        batch = prompts()
        for q, llm in llms.items():
            a, b = (True, False) if r % 2 == 0 else (False, True)
            runs = [(on, run_once(llm, batch, on)) for on in (a, b, b, a)]
            best = {on: max((x for o, x in runs if o == on), key=lambda x: x["tps"])
                    for on in (True, False)}
            ids = {on: [x["ids"] for o, x in runs if o == on] for on in (True, False)}
            new, old = ids[True][0], ids[False][0]
            row[q] = {"batched_tps": best[True]["tps"], "general_tps": best[False]["tps"],
                      "batched_decode_tps": best[True]["decode_tps"],
                      "general_decode_tps": best[False]["decode_tps"],
                      "batched_total_s": best[True]["total_s"],
                      "general_total_s": best[False]["total_s"],
                      "same_ids": new == old,
                      "same_tokens": sum(x == y for s, t in zip(new, old, strict=True)
                                         for x, y in zip(s, t, strict=True)),
                      "repeatable": all(x == ids[on][0] for on in ids for x in ids[on])}
        row["load_after"] = os.getloadavg()
        rounds.append(row)
        print(json.dumps(row), flush=True)
    summary = {}
    for q in llms:
        name = {"none": "fp32"}.get(q, q)
        ratios = [x[q]["batched_tps"] / x[q]["general_tps"] for x in rounds]
        dec = [x[q]["batched_decode_tps"] / x[q]["general_decode_tps"] for x in rounds]
        summary[name] = {
            "batched_tps_median": statistics.median(x[q]["batched_tps"] for x in rounds),
            "general_tps_median": statistics.median(x[q]["general_tps"] for x in rounds),
            "speedup_median": statistics.median(ratios),
            "speedup_min": min(ratios), "speedup_max": max(ratios),
            "batched_decode_tps_median": statistics.median(
                x[q]["batched_decode_tps"] for x in rounds),
            "general_decode_tps_median": statistics.median(
                x[q]["general_decode_tps"] for x in rounds),
            "decode_speedup_median": statistics.median(dec),
            "same_ids_all_rounds": all(x[q]["same_ids"] for x in rounds),
            "same_tokens": f"{sum(x[q]['same_tokens'] for x in rounds)}/"
                           f"{len(rounds) * BATCH * GEN}",
        }
    loads = [v for x in rounds for v in (x["load_before"][0], x["load_after"][0])]
    results = {
        "command": "python benchmarks/llm/batch_decode.py --rounds " + str(args.rounds),
        "machine": {"cpu": read_cpu().model_name, "cores": os.cpu_count(),
                    "torch": torch.__version__, "threads": 1},
        "workload": {"model": str(args.model), "prompts": BATCH, "prompt_tokens": PROMPT_LEN,
                     "generated_tokens": GEN, "greedy": True, "prefix_caching": False},
        "kernels": {{"none": "fp32"}.get(q, q): [c.to_dict() for c in llm.kernel_choices]
                    for q, llm in llms.items()},
        "load_average_1min": {"min": min(loads), "max": max(loads)},
        "decode_perplexity": {"model": "demo", "sequences": BATCH, "tokens": PPL_LEN,
                              **ppl},
        "summary": summary, "rounds": rounds,
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
