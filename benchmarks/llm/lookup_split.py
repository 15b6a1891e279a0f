"""Prompt lookup against plain decoding on run.py's repetitive workload, each request's
time split into the native calls (the prompt's prefill, plain bursts, verifications)
and everything else, per output token.

    python benchmarks/llm/lookup_split.py [--rounds 6] [--output lookup_split.json]

Only the native decoder's entry points are timed (one timer around each call), so the
split adds no timer inside the engine's rounds: ``spec_round_anatomy.py`` wraps the
rounds and the calls within them, and its timers count in the engine's share. One
thread, the benchmark's 8 prompts, 64 greedy tokens each, the engines' turns
alternating prompt by prompt. ``kernels_only`` is the speed-up if nothing but the
decode calls ran (plain's bursts against prompt lookup's verifications).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from native_kernels import machine  # noqa: E402
from run import regenerate_prompts, warm  # noqa: E402

from turboinfer.llm import LLM, EngineConfig, SamplingParams  # noqa: E402
from turboinfer.llm.backends.cpu.native_decode import NativeDecoder  # noqa: E402

GEN = 64
CALLS = {"forward": "prefill", "greedy": "decode", "greedy_rows": "decode"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--output", type=Path, default=HERE / "lookup_split.json")
    args = parser.parse_args()
    plain = warm(LLM(config=EngineConfig(num_threads=1)))
    lookup = warm(LLM(ngram=3, config=EngineConfig(num_speculative_tokens=8, num_threads=1)))
    llms = {"plain": plain, "lookup": lookup}
    prompts = regenerate_prompts(plain, 8, GEN)
    params = SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True)
    for prompt in prompts:          # the prefix caches hold every prompt in both alike
        for llm in llms.values():
            llm.generate(prompt, params)
    seconds: dict[str, dict[str, float]] = {name: defaultdict(float) for name in llms}
    who = ["plain"]

    def timed(name: str, fn: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[who[0]][CALLS[name]] += time.perf_counter() - start
        return call

    for name in CALLS:
        setattr(NativeDecoder, name, timed(name, getattr(NativeDecoder, name)))
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            for name in (list(llms) if (r + i) % 2 == 0 else list(llms)[::-1]):
                who[0] = name
                start = time.perf_counter()
                llms[name].generate(prompt, params)
                seconds[name]["total"] += time.perf_counter() - start
    tokens = args.rounds * len(prompts) * GEN
    split = {}
    for name, spent in seconds.items():
        ms = {part: 1e3 * s / tokens for part, s in spent.items()}
        ms["rest"] = ms["total"] - ms.get("prefill", 0.0) - ms.get("decode", 0.0)
        split[name] = {part: round(v, 4) for part, v in ms.items()}
    stats = lookup.engine.spec_stats
    result = {"machine": machine(), "rounds": args.rounds, "prompts": len(prompts),
              "gen_len": GEN, "ms_per_token": split,
              "speedup": split["plain"]["total"] / split["lookup"]["total"],
              "kernels_only": split["plain"]["decode"] / split["lookup"]["decode"],
              "tokens_per_round": stats.tokens_per_forward}
    for name, ms in split.items():
        print(f"{name:7s} " + "  ".join(f"{part} {v:.4f}" for part, v in ms.items()))
    print(f"speed-up {result['speedup']:.3f}x, kernels only {result['kernels_only']:.3f}x, "
          f"{result['tokens_per_round']:.2f} tokens a round")
    args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
