"""Where a speculative round's time goes, and what the round could give with none spent
outside the kernels; beside it, plain decoding with and without bursts.

    python benchmarks/llm/spec_round_anatomy.py [--threads 1] [--rounds 8] [--output F]
        [--proposer draft|ngram]

The demo model alone and with the demo draft (the engine's defaults otherwise), greedy,
64 tokens per demo prompt, the engines' turns alternating round by round (wall time);
``--proposer ngram``: prompt lookup (3-token suffixes, up to 8 tokens) on run.py's
repetitive workload (8 prompts that hold the model's earlier answer) instead:

- ``anatomy``: in the speculative engine each native call is timed at its ctypes
  boundary (the draft's proposal, the target's verification) and at the engine's call
  of it, so a round splits into the kernels' time, the calls' Python and the rest of the
  engine (accepting, appending, choosing k). The plain engine's native time per token
  is timed the same way. ``ceiling`` is the speed-up rounds of this length and yield
  would give if nothing but the kernels ran: tokens per round x native ms per plain
  token / native ms per round.
- ``burst``: the plain engine with ``decode_burst_ms`` 0 (one engine step per token)
  against the default (a burst of steps per native call), ms per token.

The timers nest (a round, the engine's call inside it, the native call inside that), and
each one's own cost lands in the split of the one around it: on a Zen 4 prompt lookup's
"engine rest" and "calls' Python" read 0.06 ms a round together where the engine spends
0.02 (``lookup_split.py`` times the native calls alone, and the engine's other work as
what is left of the request).

Writes ``spec_round_anatomy.json`` beside this script (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "src"))

from turboinfer.hardware.cpu import read_cpu  # noqa: E402
from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir  # noqa: E402

PROMPTS = ["Return a new list containing", "The default value of the timeout",
           "If the file does not exist,"]
GEN = 64


class Clock:
    """Seconds spent in wrapped callables, by label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1
        return timed


class _Lib:
    """A native library whose one-call entry points are timed."""

    def __init__(self, lib: Any, clock: Clock, tag: str) -> None:
        self._lib, self._clock, self._tag = lib, clock, tag

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._lib, name)
        if name in ("greedy_rows", "greedy_steps"):
            return self._clock.wrap(value, f"{self._tag}.native")
        return value


def instrument(llm: LLM, clock: Clock) -> None:
    engine = llm.engine
    target = engine.runner.native_decoder()
    if target is None:
        raise SystemExit("the target's step does not run natively here")
    target.lib = _Lib(target.lib, clock, "target")   # type: ignore[assignment]
    engine.runner.greedy_rows = clock.wrap(engine.runner.greedy_rows, "target.call")  # type: ignore[method-assign]
    engine.runner.greedy_steps = clock.wrap(engine.runner.greedy_steps, "target.call")  # type: ignore[method-assign]
    if engine.proposer is not None:
        if hasattr(engine.proposer, "runner"):      # a draft model
            draft = engine.proposer.runner.native_decoder()
            if draft is not None:
                draft.lib = _Lib(draft.lib, clock, "draft")   # type: ignore[assignment]
            engine.proposer.greedy_steps = clock.wrap(  # type: ignore[union-attr,method-assign]
                engine.proposer.greedy_steps, "draft.call")  # type: ignore[union-attr]
        engine._run_speculative = clock.wrap(  # type: ignore[method-assign]
            engine._run_speculative, "round")


def generate_all(llm: LLM, prompts: list[Any]) -> float:
    params = SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    for prompt in prompts:
        llm.generate(prompt, params)
    return time.perf_counter() - start


def anatomy(threads: int, rounds: int, proposer: str) -> dict[str, Any]:
    plain = LLM(config=EngineConfig(num_threads=threads))
    prompts: list[Any] = list(PROMPTS)
    if proposer == "ngram":
        from run import regenerate_prompts  # beside this script

        prompts = list(regenerate_prompts(plain, 8, GEN))
        spec = LLM(ngram=3, config=EngineConfig(num_threads=threads,
                                                num_speculative_tokens=8))
    else:
        spec = LLM(draft=demo_model_dir("draft"), config=EngineConfig(num_threads=threads))
    for llm in (plain, spec):
        generate_all(llm, prompts)
    clocks = {"plain": Clock(), "spec": Clock()}
    instrument(plain, clocks["plain"])
    instrument(spec, clocks["spec"])
    before = spec.engine.spec_stats.emitted, spec.engine.spec_stats.target_forwards
    wall: dict[str, list[float]] = {"plain": [], "spec": []}
    for r in range(rounds):
        order = [("plain", plain), ("spec", spec)]
        for name, llm in order[::1 if r % 2 else -1]:
            wall[name].append(generate_all(llm, prompts))
    spec_rounds = spec.engine.spec_stats.target_forwards - before[1]
    emitted = spec.engine.spec_stats.emitted - before[0]
    ps, ss = clocks["plain"].seconds, clocks["spec"].seconds
    plain_tokens = rounds * len(prompts) * (GEN - 1)   # the first token is the prompt's
    native_round = (ss["target.native"] + ss["draft.native"]) / spec_rounds
    calls_round = (ss["target.call"] + ss["draft.call"]) / spec_rounds - native_round
    plain_native_token = ps["target.native"] / plain_tokens
    tokens_round = emitted / spec_rounds
    ratios = [p / s for p, s in zip(wall["plain"], wall["spec"], strict=True)]
    return {
        "plain_ms_per_token": 1e3 * statistics.median(wall["plain"]) / (len(prompts) * GEN),
        "spec_ms_per_token": 1e3 * statistics.median(wall["spec"]) / (len(prompts) * GEN),
        "speedup_median": statistics.median(ratios), "speedup_rounds": ratios,
        "tokens_per_round": tokens_round,
        "round_ms": {"native": 1e3 * native_round, "calls_python": 1e3 * calls_round,
                     "engine_rest": 1e3 * (ss["round"] / spec_rounds - native_round
                                           - calls_round)},
        "plain_native_ms_per_token": 1e3 * plain_native_token,
        "ceiling": tokens_round * plain_native_token / native_round,
        "spec_length": spec.engine.spec_length.to_dict() if spec.engine.spec_length else None,
    }


def burst(threads: int, rounds: int) -> dict[str, Any]:
    llms = {"off": LLM(config=EngineConfig(num_threads=threads, decode_burst_ms=0)),
            "on": LLM(config=EngineConfig(num_threads=threads))}
    for llm in llms.values():
        generate_all(llm, PROMPTS)
    ms: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for name, llm in list(llms.items())[::1 if r % 2 else -1]:
            ms[name].append(1e3 * generate_all(llm, PROMPTS) / (len(PROMPTS) * GEN))
    ratios = sorted(a / b for a, b in zip(ms["off"], ms["on"], strict=True))
    return {"off_ms_per_token": statistics.median(ms["off"]),
            "on_ms_per_token": statistics.median(ms["on"]),
            "speedup_median": statistics.median(ratios), "speedup_sorted": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--output", default="spec_round_anatomy.json")
    parser.add_argument("--proposer", choices=("draft", "ngram"), default="draft")
    args = parser.parse_args()
    cpu = read_cpu()
    res: dict[str, Any] = {"cpu": cpu.model_name, "isa": sorted(cpu.features),
                           "threads": args.threads, "proposer": args.proposer,
                           "load_before": os.getloadavg()[0]}
    res["anatomy"] = anatomy(args.threads, args.rounds, args.proposer)
    res["burst"] = burst(args.threads, args.rounds)
    res["load_after"] = os.getloadavg()[0]
    out = HERE / args.output
    out.write_text(json.dumps(res, indent=1) + "\n")
    a, b = res["anatomy"], res["burst"]
    print(f"{res['cpu']} ({', '.join(res['isa'])}), {args.threads} thread(s)")
    print(f"speculative {a['speedup_median']:.2f}x (rounds "
          f"{min(a['speedup_rounds']):.2f}-{max(a['speedup_rounds']):.2f}); "
          f"{a['tokens_per_round']:.2f} tokens a round; round ms: "
          + ", ".join(f"{k} {v:.3f}" for k, v in a["round_ms"].items())
          + f"; ceiling {a['ceiling']:.2f}x")
    print(f"plain bursts: {b['off_ms_per_token']:.3f} -> {b['on_ms_per_token']:.3f} ms a token"
          f" ({b['speedup_median']:.2f}x)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
