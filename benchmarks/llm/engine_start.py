"""An engine's start with and without the kernel choices remembered on disk, side by side.

    python benchmarks/llm/engine_start.py [--gguf FILE ...] [--rounds 5]
        [--output engine_start.json]

For the demo model (and each GGUF file given), fresh processes alternate: ``LLM(model)``
with ``TURBOINFER_KERNEL_CACHE=off`` (every shape timed, as before the cache) and with the
cache on, after one untimed process that fills it. Recorded per process: the seconds of
``LLM()`` (imports excluded) and of those in ``measure_shape`` (0: every shape's choice
read back; a GGUF file's own Q4 blocks have one kernel and are never timed). The thread
count is remembered with the kernels (with the cache off it is timed in every process).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from native_kernels import machine  # noqa: E402

MEASURE = """
import json, sys, time
from turboinfer.llm import LLM
from turboinfer.llm.backends.cpu import kernels
timed = kernels.measure_shape
spent = [0.0]
def counted(*args, **kwargs):
    start = time.perf_counter()
    try:
        return timed(*args, **kwargs)
    finally:
        spent[0] += time.perf_counter() - start
kernels.measure_shape = counted
start = time.perf_counter()
llm = LLM(sys.argv[1] or None)
print(json.dumps({"seconds": time.perf_counter() - start, "measuring_s": spent[0]}))
"""


def start(model: str, cache: str) -> dict[str, Any]:
    env = {**os.environ, "TURBOINFER_KERNEL_CACHE": cache}
    done = subprocess.run([sys.executable, "-c", MEASURE, model], env=env,
                          capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", nargs="*", default=[], help="GGUF files to start too")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default="engine_start.json")
    args = parser.parse_args()
    record: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv),
                              "models": {}}
    for model in ["", *args.gguf]:
        name = Path(model).name if model else "demo"
        start(model, "refresh")                          # fills the cache, untimed
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for r in range(args.rounds):
            for cache in (("off", "on") if r % 2 == 0 else ("on", "off")):
                runs[cache].append(start(model, cache))
                print(name, cache, runs[cache][-1], flush=True)
        summary = {cache: {"seconds_p50": statistics.median(x["seconds"] for x in rs),
                           "measuring_s_p50": statistics.median(x["measuring_s"] for x in rs),
                           "processes_timing_nothing": sum(x["measuring_s"] == 0 for x in rs)}
                   for cache, rs in runs.items()}
        record["models"][name] = {"summary": summary, "runs": runs}
        print(name, json.dumps(summary), flush=True)
    (HERE / args.output).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
