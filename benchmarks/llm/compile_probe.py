"""Eager against ``torch.compile`` of the model's forward for decode steps (batch 1 and 16),
one thread, on the random 110M GQA Llama.

    python benchmarks/llm/compile_probe.py [MODEL_DIR] [--quant none,int8,int4]

The kernels are each format's first candidate without timing (fp32: the transposed
weight; the MKL-packed fp32 kernel does not lower in inductor). Needs a C++ compiler
(inductor's CPU backend); without one it records the error. Writes ``compile.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from turboinfer.llm.backends.cpu.kernels import select_kernels
from turboinfer.llm.model.attention import AttentionBatch
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import load_model

HERE = Path(__file__).resolve().parent


def decode_step(model: Any, forward: Any, batch: int, kv: Any) -> Any:
    tables = [[j + 5 * i for j in range(5)] for i in range(batch)]
    attn = AttentionBatch.build(starts=[64] * batch, query_lens=[1] * batch,
                                block_tables=tables, block_size=16)
    ids = torch.randint(3, 1000, (batch,))

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.logits(forward(ids, attn.positions, attn, kv))
    return run


def median_ms(fn: Any, n: int = 10) -> float:
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def probe(folder: Path, mode: QuantMode) -> dict[str, Any]:
    model = load_model(folder)
    select_kernels(model, mode, measure=False)
    kv = model.allocate_kv_cache(128, 16)
    compiled = torch.compile(model.forward, dynamic=True)
    res: dict[str, Any] = {}
    for batch in (1, 16):
        start = time.perf_counter()
        try:
            step = decode_step(model, compiled, batch, kv)
            step()
        except Exception as exc:  # any inductor failure is the outcome to record
            res["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return res
        res[f"compile_s_b{batch}"] = time.perf_counter() - start
        eager = decode_step(model, model.forward, batch, kv)
        e, c = [], []
        for _ in range(5):   # interleaved rounds
            e.append(median_ms(eager))
            c.append(median_ms(step))
        res[f"eager_ms_b{batch}"], res[f"compiled_ms_b{batch}"] = (statistics.median(e),
                                                                  statistics.median(c))
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default="/work/peers/llm110m-gqa")
    parser.add_argument("--quant", default="none,int8,int4")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out: dict[str, Any] = {"cxx": shutil.which("c++") or shutil.which("g++"),
                           "load_average_at_start": os.getloadavg()}
    for mode in args.quant.split(","):
        out[mode] = probe(Path(args.model), QuantMode(mode))
        print(mode, out[mode], flush=True)
    out["load_average_at_end"] = os.getloadavg()
    (HERE / "compile.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
