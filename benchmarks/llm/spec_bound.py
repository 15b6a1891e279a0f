"""How far speculative decoding can go on the demo model when plain decoding runs as one
native call per token: the arithmetic, from measured parts.

``python benchmarks/llm/spec_bound.py [--rounds N]``: one thread. Measures, on the demo
target and its draft as the engine loads them (both on the native one-call step):
  - the plain engine's seconds per generated token (greedy, 64 tokens, the demo prompts);
  - ``T(r)``: the target's native step over ``r`` new tokens of one sequence, logits for
    every row (a verification of ``r - 1`` drafted tokens);
  - ``D``: a draft step inside the one-call greedy proposal (``ti_greedy_steps``);
  - ``E(k)``: the tokens one verification yields with k drafted tokens, counted by
    running the engine at each k on the demo prompts (greedy, so the same every run).
    Acceptance comes in runs (a draft that is right is likely right again), so E(k) is
    well above the ``(1 - a^(k+1)) / (1 - a)`` of independent acceptances at rate ``a``.
No speculative decoder yielding E(k) tokens per verification can beat
``E(k) * plain / (T(k + 1) + k * D)``: the bound leaves out every cost of speculation
besides the target's and draft's steps (acceptance, the engine's bookkeeping), while
the plain side keeps its own. Each of ``--rounds`` rounds measures every part back to
back and gives its own bound; the median and the highest round are reported. Written
to spec_bound.json.
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
from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir
from turboinfer.llm.backends.cpu.native_decode import NativeDecoder

PROMPTS = ["Return a new list containing", "The default value of the timeout",
           "If the file does not exist,"]
GEN, K, START, MAX_ROWS = 64, 6, 40, 9


def native_llm(**kwargs: Any) -> LLM:
    """Kernels are chosen by timing: load until both target and draft run natively."""
    for _ in range(10):
        llm = LLM(**kwargs)
        proposer = getattr(llm.engine.proposer, "runner", None)
        if llm.engine.runner.decode_path() == "native" and (
                proposer is None or proposer.decode_path() == "native"):
            return llm
    raise SystemExit("the demo model did not load on the native step")


def best_seconds(fn: Any, reps: int, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    # One thread, as run.py's speculative section measures (unset, the engine would
    # pick its count by measurement, and the bound would compare other steps).
    plain = native_llm(config=EngineConfig(num_threads=1))
    spec = native_llm(draft=demo_model_dir("draft"),
                      config=EngineConfig(num_speculative_tokens=K, num_threads=1))
    params = SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True)
    tokens_per_forward, acceptance = {}, {}
    for k in range(1, MAX_ROWS):
        at_k = LLM(draft=demo_model_dir("draft"),
                   config=EngineConfig(num_speculative_tokens=k, num_threads=1))
        for prompt in PROMPTS:
            at_k.generate(prompt, params)
        tokens_per_forward[k] = at_k.engine.spec_stats.tokens_per_forward
        acceptance[k] = at_k.engine.spec_stats.acceptance_rate

    target = spec.engine.runner.native_decoder()
    draft = spec.engine.proposer.runner.native_decoder()  # type: ignore[union-attr]
    assert isinstance(target, NativeDecoder) and isinstance(draft, NativeDecoder)
    table = list(range(8))
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        # One round measures every part back to back, so a round's bound compares parts
        # timed under the same load.
        start = time.process_time()
        for prompt in PROMPTS:
            plain.generate(prompt, params)
        plain_s = (time.process_time() - start) / (GEN * len(PROMPTS))
        verify = {r: best_seconds(lambda r=r: target.forward(list(range(5, 5 + r)), START,
                                                             table, r), 20, 3)
                  for r in range(1, MAX_ROWS + 1)}
        draft_step = best_seconds(lambda: draft.greedy([5], START, table, K), 20, 3) / K
        rounds.append({"plain_cpu_s_per_token": plain_s, "target_step_s_by_rows": verify,
                       "draft_step_s": draft_step})

    def bound(row: dict[str, Any], k: int, tokens: float) -> float:
        return tokens * row["plain_cpu_s_per_token"] / (
            row["target_step_s_by_rows"][k + 1] + k * row["draft_step_s"])

    ks = range(1, MAX_ROWS)
    measured = {k: [bound(row, k, tokens_per_forward[k]) for row in rounds] for k in ks}
    every = {k: [bound(row, k, k + 1) for row in rounds] for k in ks}
    results = {
        "command": f"python benchmarks/llm/spec_bound.py --rounds {args.rounds}",
        "machine": {"cpu": read_cpu().model_name, "cores": os.cpu_count(),
                    "torch": torch.__version__, "threads": 1},
        "load_average_1min": {"start": load_start[0], "end": os.getloadavg()[0]},
        "tokens_per_forward_by_k": tokens_per_forward,
        "acceptance_by_k": acceptance,
        "bound_by_k_measured_tokens": {
            k: {"median": statistics.median(v), "max": max(v)} for k, v in measured.items()},
        "bound_by_k_every_draft_accepted": {
            k: {"median": statistics.median(v), "max": max(v)} for k, v in every.items()},
        "rounds": rounds,
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
