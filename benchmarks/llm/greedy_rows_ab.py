"""A lone greedy sequence's steps with and without the one-call greedy choice
(``ModelRunner.greedy_rows``: the native step, the LM head and each row's argmax in one
C call), side by side in one process.

    python benchmarks/llm/greedy_rows_ab.py [--rounds 7] [--gguf PATH]

The "logits" engines are the same engines with ``greedy_rows`` switched off, so their
steps hand the logits back to Python for the argmax as before. Demo model alone (plain
decoding) and with the demo draft (speculative: the verification takes the one call),
one thread, greedy, 64 tokens per prompt, the three demo prompts twice per engine and
round after an untimed pass, the engines' order alternating by round; with ``--gguf``,
plain decoding of that file too (three short code prompts). Output tokens per CPU
second, the median of the per-round ratios with the lowest and highest; raw figures,
the machine and its ISA go to ``greedy_rows_ab.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from native_kernels import machine  # noqa: E402

from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir  # noqa: E402

DEMO = ["Return a new list containing", "The default value of the timeout",
        "If the file does not exist,"]
CODE = ["def read_file(path):", "The os module provides", "class Queue:"]
PARAMS = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)


def logits_path(llm: LLM) -> LLM:
    """``llm`` with the one-call greedy choice off: every step returns logits."""
    llm.engine.runner.greedy_rows = lambda item: None  # type: ignore[method-assign]
    return llm


def tokens_per_cpu_s(llm: LLM, prompts: list[str], repeats: int) -> tuple[float, list[int]]:
    cpu, tokens, out = time.process_time(), 0, []
    for _ in range(repeats):
        for prompt in prompts:
            ids = list(llm.generate(prompt, PARAMS)[0].token_ids)
            tokens += len(ids)
            out += ids
    return tokens / (time.process_time() - cpu), out


def _isa() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n")[0].split()
    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--output", default="greedy_rows_ab.json")
    args = parser.parse_args()
    one = EngineConfig(num_threads=1)
    pairs: dict[str, tuple[list[str], int, LLM, LLM]] = {
        "demo_plain": (DEMO, 2, LLM(config=one), logits_path(LLM(config=one))),
        "demo_draft": (DEMO, 2, LLM(draft=demo_model_dir("draft"), config=one),
                       logits_path(LLM(draft=demo_model_dir("draft"), config=one)))}
    if args.gguf:
        pairs["gguf_plain"] = (CODE, 1, LLM(args.gguf, config=one),
                               logits_path(LLM(args.gguf, config=one)))
    for prompts, _, fused, logits in pairs.values():
        for llm in (fused, logits):
            tokens_per_cpu_s(llm, prompts, 1)       # untimed: prefix caches, warm kernels
    loads = [os.getloadavg()[0]]
    raw: dict[str, dict[str, list[float]]] = {k: {"fused": [], "logits": []} for k in pairs}
    same = {k: True for k in pairs}
    for round_ in range(args.rounds):
        for key, (prompts, repeats, fused, logits) in pairs.items():
            order = [("fused", fused), ("logits", logits)]
            outputs = {}
            for name, llm in (order if round_ % 2 == 0 else order[::-1]):
                tps, outputs[name] = tokens_per_cpu_s(llm, prompts, repeats)
                raw[key][name].append(tps)
            same[key] &= outputs["fused"] == outputs["logits"]
            print(f"round {round_} {key}: fused {raw[key]['fused'][-1]:.1f} logits "
                  f"{raw[key]['logits'][-1]:.1f} tokens/CPU-s", flush=True)
        loads.append(os.getloadavg()[0])
    summary: dict[str, Any] = {}
    for key, cells in raw.items():
        ratios = [f / g for f, g in zip(cells["fused"], cells["logits"], strict=True)]
        summary[key] = {"fused_median": statistics.median(cells["fused"]),
                        "logits_median": statistics.median(cells["logits"]),
                        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                        "ratio_max": max(ratios), "identical_tokens": same[key]}
    result = {"command": " ".join(sys.argv), "machine": machine(), "isa": _isa(),
              "load_average_1m": loads, "raw": raw, "summary": summary}
    (HERE / args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
