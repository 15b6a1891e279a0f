"""The round-size choice (``llm/engine/spec_length.py``) against every fixed k, on a clock
the machine's neighbours cannot move: real greedy rounds of the demo target, each charged
the round cost measured at load.

    python benchmarks/llm/spec_length_replay.py [--draft-costs "0.55,0.70,..."]
        [--lookup-costs "0.39,0.43,..."] [--output F]

The engines run for real (the tokens, the acceptance, the chooser's decisions are the
engine's); only the time is replayed: a round of k proposals costs ``round_ms[k]`` as the
engine measured it when built (``--draft-costs`` / ``--lookup-costs`` replay another
machine's: k = 0 up, one per k, as ``llm bench`` prints them), plus the same engine
overhead per round for every engine. The demo draft (k <= 6) on the three demo prompts,
prompt lookup (up to 8) on the repetitive workload of ``run.py``; the speed-up is over
plain decoding (a round of k = 0 per token). A k that is best on one machine is not on
another: the replay says how far the measured choice stays from the best fixed k.
Writes ``spec_length_replay.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from native_kernels import machine  # noqa: E402
from run import DEMO_PROMPTS, regenerate_prompts, warm  # noqa: E402

from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir  # noqa: E402
from turboinfer.llm.engine.spec_length import SpeculationLength  # noqa: E402

PARAMS = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
OVERHEAD_MS = 0.06     # the engine's own work per step (scheduling, appending), any k


def replay(make: dict[str, object], prompts: list, costs: list[float], repeats: int,
           adapt: bool, k: int) -> dict[str, object]:
    """One engine's rounds over ``prompts``; time = the cost table."""
    llm = LLM(**make, config=EngineConfig(num_speculative_tokens=k, num_threads=1,
                                          adapt_speculative_tokens=False))
    engine = llm.engine
    if adapt:
        engine.spec_length = SpeculationLength(costs[:k + 1])
    rounds: collections.Counter[int] = collections.Counter()
    record = engine._record_spec

    def counted(drafted: int, emitted: int) -> None:
        rounds[drafted] += 1
        record(drafted, emitted)

    engine._record_spec = counted  # type: ignore[method-assign]
    tokens = sum(len(llm.generate(p, PARAMS)[0].token_ids)
                 for _ in range(repeats) for p in prompts)
    ms = sum((costs[d] + OVERHEAD_MS) * n for d, n in rounds.items())
    return {"tokens_per_ms": tokens / ms,
            "speedup": (tokens / ms) * (costs[0] + OVERHEAD_MS),
            "tokens_per_round": engine.spec_stats.tokens_per_forward,
            "rounds_by_k": [rounds.get(i, 0) for i in range(k + 1)]}


def measured_or(given: str | None, make: dict[str, object], top: int = 6) -> list[float]:
    """The given costs, else this machine's as an engine measures them when built."""
    if given:
        return [float(c) for c in given.split(",")]
    llm = LLM(**make, config=EngineConfig(num_speculative_tokens=top, num_threads=1))
    if llm.engine.spec_length is None:
        raise SystemExit("the demo target does not run on the native step here")
    return llm.engine.spec_length.round_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft-costs", default=None,
                    help="the draft's round costs in ms, k = 0..6 (default: measured here)")
    ap.add_argument("--lookup-costs", default=None,
                    help="prompt lookup's round costs in ms, k = 0..8 (default: measured)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--output", type=Path, default=HERE / "spec_length_replay.json")
    args = ap.parse_args()
    tables = {"draft": measured_or(args.draft_costs, {"draft": demo_model_dir("draft")}),
              "lookup": measured_or(args.lookup_costs, {"ngram": 3}, top=8)}
    plain = warm(LLM(config=EngineConfig(num_threads=1)))
    workloads = {"draft": ({"draft": demo_model_dir("draft")}, list(DEMO_PROMPTS), 6),
                 "lookup": ({"ngram": 3}, regenerate_prompts(plain, 8, 64), 8)}
    out: dict[str, object] = {"costs_ms": tables, "overhead_ms": OVERHEAD_MS,
                              "machine": machine(), "workloads": {}}
    for name, (make, prompts, top) in workloads.items():
        table = list(tables[name])
        res: dict[str, object] = {}
        if name == "draft":
            for k in range(1, top + 1):
                res[f"fixed k={k}"] = replay(make, prompts, table, args.repeats, False, k)
        else:
            res[f"uncut, up to {top}"] = replay(make, prompts, table, 1, False, top)
        res["measured choice"] = replay(make, prompts, table,
                                        args.repeats if name == "draft" else 1, True, top)
        for label, r in res.items():
            print(f"{name:6s} {label:18s} {r['speedup']:.3f}x  "  # type: ignore[index]
                  f"tokens/round {r['tokens_per_round']:.2f}  "  # type: ignore[index]
                  f"rounds by k {r['rounds_by_k']}", flush=True)  # type: ignore[index]
        out["workloads"][name] = res  # type: ignore[index]
    args.output.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
