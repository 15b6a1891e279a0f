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
4. Whether a better rule for the proposal's length is what is missing: the best fixed
   length for each length of suffix matched (1, 2 or 3 tokens; none: a plain step),
   fitted on one set of prompts and replayed on the other (the benchmark's 8 and 32
   held-out prompts of the same kind), beside the engine's choice on the same prompts,
   with the engine's work per round at 0.06, 0.03 and 0 ms.
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
HELD_OUT = 32       # prompts of the workload's kind beyond the benchmark's 8
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


def fitted_lengths(prompts: list[list[int]], outputs: list[list[int]], costs: list[float],
                   engine_ms: float, table: dict[int, int]) -> tuple[dict[str, float],
                                                                     dict[int, int]]:
    """Rounds over the outputs proposing ``table[m]`` tokens of the latest match of an
    m-token suffix (2 where the table has no m yet); the result, and the table refitted
    on these rounds (per m, the length with the most tokens per ms)."""
    lookup = NgramProposer(3, MAX_K)
    seen: dict[int, list[tuple[int, int]]] = {}   # m -> (tokens kept, tokens found)
    tokens = rounds = 0
    ms = 0.0
    for prompt, out in zip(prompts, outputs, strict=True):
        seq, t = list(prompt), 0
        while t < len(out):
            truth = out[t:]
            found, matched = lookup._lookup(seq, min(MAX_K, len(truth) - 1))
            seen.setdefault(matched, []).append((matching_prefix(found, truth), len(found)))
            proposal = found[:table.get(matched, 2)]
            step = min(matching_prefix(proposal, truth) + 1, len(truth))
            seq += truth[:step]
            t += step
            tokens += step
            rounds += 1
            ms += costs[len(proposal)] + engine_ms

    def rate(k: int, fates: list[tuple[int, int]]) -> float:
        return (sum(min(kept, k) + 1 for kept, _ in fates)
                / sum(costs[min(k, found)] + engine_ms for _, found in fates))

    refit = {m: max(range(MAX_K + 1), key=lambda k, f=fates: rate(k, f))  # type: ignore[misc]
             for m, fates in seen.items()}
    return {"tokens_per_round": tokens / rounds, "speedup": tokens / ms * costs[0]}, refit


def length_rules(prompts: list[list[int]], outputs: list[list[int]],
                 held: list[list[int]], held_outputs: list[list[int]],
                 costs: list[float]) -> dict[str, dict[str, object]]:
    """The engine's choice against the best length per matched suffix, cross-fitted."""
    sets = {"benchmark": (prompts, outputs), "held_out": (held, held_outputs)}
    out: dict[str, dict[str, object]] = {}
    for engine_ms in (ENGINE_MS, 0.03, 0.0):
        row: dict[str, object] = {}
        for name, (p, o) in sets.items():
            other = sets["held_out" if name == "benchmark" else "benchmark"]
            table: dict[int, int] = {}
            for _ in range(3):      # the rounds depend on the table: refit on its own rounds
                _, table = fitted_lengths(*other, costs, engine_ms, table)
            fitted, _ = fitted_lengths(p, o, costs, engine_ms, table)
            row[name] = {"engine": replay(p, o, costs, engine_ms, oracle=False),
                         "fitted_per_match": fitted, "table": table,
                         "oracle": replay(p, o, costs, engine_ms, oracle=True)}
        out[f"engine_ms {engine_ms}"] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=HERE / "lookup_ceiling.json")
    args = parser.parse_args()
    plain = warm(LLM(config=EngineConfig(num_threads=1)))
    every = regenerate_prompts(plain, 8 + HELD_OUT, 64)    # the benchmark's 8 first
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    outputs = [list(plain.generate(p, params)[0].token_ids) for p in every]
    prompts, held, held_outputs = every[:8], every[8:], outputs[8:]
    outputs = outputs[:8]
    costs = row_costs()
    result: dict[str, object] = {"machine": machine(), "row_costs_ms": costs,
                                 "engine_ms": ENGINE_MS, "replay": {}}
    for label, engine_ms in (("engine work per round", ENGINE_MS), ("none", 0.0)):
        for who, oracle in (("engine's choice", False), ("oracle", True)):
            r = replay(prompts, outputs, costs["back_to_back"], engine_ms, oracle)
            result["replay"][f"{who}, {label}"] = r  # type: ignore[index]
            print(f"{who:16s} {label:22s} {r['speedup']:.2f}x  "
                  f"{r['tokens_per_round']:.2f} tokens a round", flush=True)
    result["length_rules"] = length_rules(prompts, outputs, held, held_outputs,
                                          costs["back_to_back"])
    for label, row in result["length_rules"].items():  # type: ignore[union-attr]
        for name, r in row.items():
            print(f"{label:14s} {name:9s} engine {r['engine']['speedup']:.2f}x  "
                  f"fitted per match {r['fitted_per_match']['speedup']:.2f}x "
                  f"{r['table']}  oracle {r['oracle']['speedup']:.2f}x", flush=True)
    print("rows 1..9, back to back:", [round(c, 3) for c in costs["back_to_back"]])
    print("rows 1..9, Python between:", [round(c, 3) for c in costs["python_between"]])
    args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
