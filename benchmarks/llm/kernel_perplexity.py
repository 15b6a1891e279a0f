"""Perplexity of a GGUF model with one quantized kernel on every linear layer of the body and
another on the LM head, for the kernels as they stand and, with ``--baseline REV``, the
native kernels as ``kernels.c`` stood at that git revision (built by native_kernels.py's
``baseline_library``): what a change to a kernel's arithmetic does to a real model.

    python benchmarks/llm/kernel_perplexity.py --gguf FILE [--baseline REV]
        [--pairs int8_native:int8_native int4_native:int8_weight_only_bf16 ...]
        [--tokens 4096 --window 512] [--out kernel_perplexity.json]

The text and its windows are gguf_perplexity.py's (the docstrings of a fixed list of
standard-library modules, non-overlapping windows each scored from its start). A pair is
BODY:HEAD, each a candidate name of ``kernel_candidates.py`` (``none``: keep fp32).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gguf_perplexity import _cpu, text  # noqa: E402  (beside this script)
from native_kernels import baseline_library  # noqa: E402

from turboinfer.llm import LLM  # noqa: E402
from turboinfer.llm.api import model_folder  # noqa: E402
from turboinfer.llm.backends.cpu.kernel_candidates import (  # noqa: E402
    NativeInt4Kernel,
    NativeInt8Kernel,
)
from turboinfer.llm.backends.cpu.kernels import SelectedLinear, _build  # noqa: E402
from turboinfer.llm.model.config import QuantMode  # noqa: E402
from turboinfer.llm.model.loader import load_model  # noqa: E402
from turboinfer.llm.perplexity import perplexity  # noqa: E402

PAIRS = ("int8_native:int8_native", "int4_native:int4_native",
         "int4_native:int8_weight_only_bf16", "int4_native:int8_native",
         "int8_weight_only_bf16:int8_weight_only_bf16",
         "int4_weight_only_bf16:int8_weight_only_bf16")
NATIVE = {"int8_native": NativeInt8Kernel, "int4_native": NativeInt4Kernel}


def _mode(name: str) -> QuantMode:
    return (QuantMode.INT4 if name.startswith("int4") else QuantMode.INT8
            if name.startswith("int8") else QuantMode.NONE)


def score(folder: Path, ids: list[int], window: int, body: str, head: str,
          library: Any = None) -> float:
    """Perplexity with ``body`` on every linear layer but the LM head and ``head`` on it;
    native kernels on ``library`` where one is given."""
    model = load_model(folder)
    with torch.inference_mode():
        for parent in list(model.modules()):
            for child_name, child in list(parent.named_children()):
                if not isinstance(child, nn.Linear):
                    continue
                name = head if child_name == "lm_head" else body
                if _mode(name) is QuantMode.NONE:
                    continue
                if library is not None and name in NATIVE:
                    kernel = NATIVE[name](library, child.weight.detach().float(), child.bias)
                else:
                    kernel = _build(_mode(name), name, child, 16, 32)[0]
                setattr(parent, child_name, SelectedLinear(
                    kernel, kernel, 2**62, child.in_features, child.out_features))
    return perplexity(model, ids, window=window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--baseline", help="git revision whose native kernels to add")
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS))
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--out", type=Path, default=HERE / "kernel_perplexity.json")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    started, load_start = time.time(), os.getloadavg()
    folder = model_folder(args.gguf)
    llm = LLM(args.gguf, quant="none")
    ids = llm.tokenizer.encode(text())[:args.tokens]
    del llm
    before = baseline_library(args.baseline) if args.baseline else None
    results: dict[str, dict[str, float]] = {}
    for pair in args.pairs:
        body, head = pair.split(":")
        row = {"now": score(folder, ids, args.window, body, head)}
        if before is not None and (body in NATIVE or head in NATIVE):
            row[f"at {args.baseline}"] = score(folder, ids, args.window, body, head, before)
        results[pair] = row
        print(pair, "  ".join(f"{k} {v:.4f}" for k, v in row.items()), flush=True)
    fp32 = score(folder, ids, args.window, "none", "none")
    print("fp32", f"{fp32:.4f}", flush=True)
    args.out.write_text(json.dumps({
        "gguf": args.gguf.name, "tokens": len(ids), "window": args.window,
        "command": " ".join(sys.argv), "baseline": args.baseline, "machine": _cpu(),
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "seconds": time.time() - started, "fp32": fp32, "body:head": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
