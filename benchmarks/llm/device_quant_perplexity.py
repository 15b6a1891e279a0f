"""Perplexity of a model on the general path (the one a GPU runs) in each quantization,
against the same model unquantized in the same dtype, on one fixed text.

    python benchmarks/llm/device_quant_perplexity.py --model FILE_OR_FOLDER
        [--device cpu|cuda] [--dtype bfloat16] [--tokens 4096 --window 512]

The text and its windows are ``gguf_perplexity.py``'s. Modes: none, int8, int4 (groups of
32) and fp8, each loaded by ``LLM(..., quant=mode)`` as a user would, so each layer runs
the kernel or the fallback measured faster here; ``llm.quant_layers`` says which. fp8 is
also scored with every quantized layer on ``torch._scaled_mm`` (``fp8_all_kernel``), which
is what a Hopper GPU runs and a CPU does not choose (its float8 matmul is a slow
reference), so the activations' float8 rounding is measured on any machine.
Writes ``--output`` (default ``device_quant_perplexity.json``) beside this script.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from turboinfer.llm import LLM
from turboinfer.llm.model.quant_device import Fp8Linear
from turboinfer.llm.perplexity import perplexity

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gguf_perplexity import _cpu, text  # noqa: E402

MODES = ("none", "int8", "int4", "fp8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--output", default="device_quant_perplexity.json")
    args = parser.parse_args()
    ppl: dict[str, float] = {}
    layers: dict[str, dict[str, int]] = {}
    ids: list[int] = []
    for mode in MODES:
        # backend torch: the general path on a CPU even in float32.
        llm = LLM(args.model, quant=mode, device=args.device, dtype=args.dtype,
                  backend="torch")
        ids = ids or llm.tokenizer.encode(text())[:args.tokens]
        ppl[mode] = perplexity(llm.model, ids, window=args.window)
        layers[mode] = llm.quant_layers["target"]
        if mode == "fp8":
            for module in llm.model.modules():
                if isinstance(module, Fp8Linear):
                    module.enable_kernel()
            ppl["fp8_all_kernel"] = perplexity(llm.model, ids, window=args.window)
        print(mode, ppl, layers[mode], flush=True)
        del llm
    result = {
        "model": args.model.name, "device": args.device, "dtype": args.dtype,
        "tokens": len(ids), "window": args.window, "perplexity": ppl,
        "increase_pct": {k: 100 * (v / ppl["none"] - 1) for k, v in ppl.items()},
        "layers_kernel_or_fallback": layers,
        "machine": {**_cpu(), "python": platform.python_version()},
        "command": " ".join(["python", "benchmarks/llm/device_quant_perplexity.py",
                             *sys.argv[1:]]),
    }
    (HERE / args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
