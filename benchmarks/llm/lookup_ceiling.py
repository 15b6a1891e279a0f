"""How far prompt lookup can go on the repetitive workload of ``run.py``, with the round
costs a round pays in the engine, and what knowing each proposal's fate would give.

    python benchmarks/llm/lookup_ceiling.py [--output lookup_ceiling.json]

1. The workload's greedy outputs (the plain engine, 8 prompts, 64 tokens).
2. The target's verification over r = 1..9 rows at the workload's context (position 120),
   timed as the engine calls it: the median of 300 calls per r, the r's interleaved over 6
   rounds, once back to back and once with engine-like Python (a prompt lookup over 150
   tokens, a few dicts) between the calls.
3. The rounds replayed on the outputs (the engine's proposer: the latest match of the
   longest suffix up to 3, its sizing rule, cut by ``SpeculationLength`` on these costs)
   against an oracle that proposes exactly the tokens the target will keep, each charged
   the measured cost plus the engine's own work per round (0.06 ms, or none), the plain
   token at the 1-row cost. Speed-ups are over plain decoding.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import matching_prefix  # noqa: E402
from native_kernels import machine  # noqa: E402
from run import regenerate_prompts, warm  # noqa: E402

from turboinfer.llm import LLM, EngineConfig, SamplingParams  # noqa: E402
from turboinfer.llm.backends.base import StepItem  # noqa: E402
from turboinfer.llm.engine.spec_length import SpeculationLength  # noqa: E402
from turboinfer.llm.engine.speculative import NgramProposer  # noqa: E402

MAX_K = 8
ENGINE_MS = 0.06    # the engine's work around a round's native call (spec_round_anatomy.py)


def row_costs(repeats: int = 300, rounds: int = 6) -> dict[str, list[float]]:
    """Median ms of the verification over 1..MAX_K + 1 rows, without and with Python
    between the calls."""
    engine = LLM(ngram=3, config=EngineConfig(num_speculative_tokens=MAX_K,
                                              num_threads=1)).engine
    start = 120
    table = list(range((start + MAX_K + 1) // engine.config.block_size + 1))
    feed = [t % 2048 for t in range(1, MAX_K + 2)]
    lookup = NgramProposer(3, MAX_K)
    history = [random.Random(0).randrange(2048) for _ in range(150)]

    def between() -> None:
        lookup._lookup(history, MAX_K)
        {i: [i] * 3 for i in range(40)}

    times: dict[tuple[int, bool], list[float]] = {}
    for r in range(rounds):
        for rows in range(1, MAX_K + 2):
            item = StepItem(feed[:rows], start, table, rows)
            for python in ((False, True) if r % 2 == 0 else (True, False)):
                spent = []
                for _ in range(repeats):
                    if python:
                        between()
                    t0 = time.perf_counter()
                    engine.runner.greedy_rows(item)
                    spent.append(1e3 * (time.perf_counter() - t0))
                times.setdefault((rows, python), []).append(statistics.median(spent))
    return {name: [statistics.median(times[(rows, python)]) for rows in range(1, MAX_K + 2)]
            for name, python in (("back_to_back", False), ("python_between", True))}


def replay(prompts: list[list[int]], outputs: list[list[int]], costs: list[float],
           engine_ms: float, oracle: bool) -> dict[str, float]:
    """Rounds over the outputs, twice (the chooser learns in the first)."""
    proposer, choice = NgramProposer(3, MAX_K), SpeculationLength(costs)
    tokens = rounds = 0
    ms = 0.0
    for _ in range(2):
        for prompt, out in zip(prompts, outputs, strict=True):
            seq, t, last = list(prompt), 0, None
            while t < len(out):
                truth = out[t:]
                found, matched = proposer._lookup(seq, min(MAX_K, len(truth) - 1))
                grown = 2 * len(last[1]) if last and last[2] and last[1] else 0
                proposal = found[:max(1, matched * (matched + 1) // 2, grown)]
                if proposal:
                    cut = (matching_prefix(proposal, truth) if oracle
                           else choice.truncate(len(proposal)))
                    proposal = proposal[:cut]
                accepted = matching_prefix(proposal, truth)
                choice.record(len(proposal), accepted)
                last = (t, proposal, accepted == len(proposal))
                step = min(accepted + 1, len(truth))
                seq += truth[:step]
                t += step
                tokens += step
                rounds += 1
                ms += costs[len(proposal)] + engine_ms
    plain_ms = costs[0]      # bursts: plain decoding pays no engine work per token
    return {"tokens_per_round": tokens / rounds, "speedup": tokens / ms * plain_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=HERE / "lookup_ceiling.json")
    args = parser.parse_args()
    plain = warm(LLM(config=EngineConfig(num_threads=1)))
    prompts = regenerate_prompts(plain, 8, 64)
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    outputs = [plain.generate(p, params)[0].token_ids for p in prompts]
    costs = row_costs()
    result: dict[str, object] = {"machine": machine(), "row_costs_ms": costs,
                                 "engine_ms": ENGINE_MS, "replay": {}}
    for label, engine_ms in (("engine work per round", ENGINE_MS), ("none", 0.0)):
        for who, oracle in (("engine's choice", False), ("oracle", True)):
            r = replay(prompts, outputs, costs["back_to_back"], engine_ms, oracle)
            result["replay"][f"{who}, {label}"] = r  # type: ignore[index]
            print(f"{who:16s} {label:22s} {r['speedup']:.2f}x  "
                  f"{r['tokens_per_round']:.2f} tokens a round", flush=True)
    print("rows 1..9, back to back:", [round(c, 3) for c in costs["back_to_back"]])
    print("rows 1..9, Python between:", [round(c, 3) for c in costs["python_between"]])
    args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
