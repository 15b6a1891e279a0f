"""Perplexity of a GGUF model in turboinfer at fp32, int8 and int4 on one fixed text, and,
when a llama-cpp-python venv is given, llama.cpp's perplexity of the same file (and of it
re-quantized to Q8_0 and Q4_0) on the same token ids; and each of turboinfer's quantized
kernels alone, to tell the weights' loss from the activations'.

    python benchmarks/llm/gguf_perplexity.py --gguf FILE [--llamacpp-python VENV/bin/python]
        [--tokens 4096 --window 512] [--no-per-kernel]

The text: the docstrings of a fixed list of standard-library modules (json, argparse,
collections, textwrap, pathlib, functools), tokenized once by the file's own tokenizer
(through turboinfer), cut to ``--tokens``. Perplexity is exp(mean next-token cross-entropy)
over non-overlapping windows of ``--window`` tokens, each window scored from its start,
for both engines. llama.cpp runs in its own venv on the given file as llama.cpp quantized
it (e.g. Q4_1), with ``logits_all``; turboinfer's fp32 is that file dequantized, and its
int8 / int4 (group 32) / q8 quantize the dequantized weights again, except that int4 takes
a Q4_0/Q4_1 file's blocks as they are (q8 finds a Q8_0 file's blocks again exactly).
turboinfer also reads llama.cpp's Q8_0 and Q4_0 re-quantizations of the file (int8, q8
and int4 on the same weights as llama.cpp there).
Writes ``--output`` (default ``gguf_perplexity.json``) beside this script.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from turboinfer.hardware import profile
from turboinfer.llm import LLM, EngineConfig
from turboinfer.llm.api import model_folder
from turboinfer.llm.backends.cpu.kernel_candidates import DynamicInt8Kernel
from turboinfer.llm.backends.cpu.kernels import SelectedLinear, _build
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.perplexity import perplexity

HERE = Path(__file__).resolve().parent
MODULES = ("json", "argparse", "collections", "textwrap", "pathlib", "functools")

QUANTIZE = """
import ctypes, sys, llama_cpp as lc
p = lc.llama_model_quantize_default_params()
p.ftype = getattr(lc, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
p.allow_requantize = True
p.nthread = 2
sys.exit(lc.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
"""

LLAMA_CPP = """
import json, math, sys
import numpy as np
from llama_cpp import Llama
path, ids_file, window = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = json.load(open(ids_file))
llm = Llama(model_path=path, n_ctx=window, logits_all=True, n_threads=2, verbose=False)
total, count = 0.0, 0
for start in range(0, len(ids) - 1, window):
    chunk = ids[start:start + window + 1]
    if len(chunk) < 2:
        break
    llm.reset()
    llm.eval(chunk[:-1])
    logits = np.asarray(llm.scores[:len(chunk) - 1], dtype=np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    total -= float(logp[np.arange(len(chunk) - 1), chunk[1:]].sum())
    count += len(chunk) - 1
print(json.dumps({"perplexity": math.exp(total / count), "tokens": count}))
"""


def text() -> str:
    docs = []
    for name in MODULES:
        module = importlib.import_module(name)
        for _, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc:
                docs.append(doc)
    return "\n\n".join(docs)


def llama_cpp(args: argparse.Namespace, ids: list[int], tmp: Path
              ) -> tuple[dict[str, float], dict[str, Path]]:
    """llama.cpp's perplexity of the file as it is and re-quantized to Q8_0 and Q4_0
    (from the file's own weights, as turboinfer's int8/int4 start from them too); the
    files, in ``tmp``, for turboinfer to read as well."""
    out: dict[str, float] = {}
    ids_file = tmp / "ids.json"
    ids_file.write_text(json.dumps(ids))
    files = {"file": args.gguf}
    for ftype in ("Q8_0", "Q4_0"):
        files[ftype] = tmp / f"{args.gguf.stem}.{ftype}.gguf"
        subprocess.run([args.llamacpp_python, "-c", QUANTIZE, str(args.gguf),
                        str(files[ftype]), ftype], capture_output=True, check=True)
    for label, path in files.items():
        done = subprocess.run([args.llamacpp_python, "-c", LLAMA_CPP, str(path),
                               str(ids_file), str(args.window)], capture_output=True,
                              text=True, check=True)
        out[label] = json.loads(done.stdout.strip().splitlines()[-1])["perplexity"]
        print("llama.cpp", label, out[label], flush=True)
    return out, files


def same_files(files: dict[str, Path], ids: list[int], window: int) -> dict[str, float]:
    """turboinfer on llama.cpp's own Q8_0 and Q4_0 files: int8 from the Q8_0 weights, q8
    and int4 on the Q8_0 / Q4_0 blocks as they are (``model/gguf.py``)."""
    out = {}
    for ftype, quant in (("Q8_0", "int8"), ("Q8_0", "q8"), ("Q4_0", "int4")):
        llm = LLM(files[ftype], quant=quant, config=EngineConfig(quant_group_size=32))
        out[f"{ftype} {quant}"] = perplexity(llm.model, ids, window=window)
        print("turboinfer on", ftype, quant, out[f"{ftype} {quant}"], flush=True)
    return out


def per_kernel(gguf: Path, ids: list[int], window: int) -> dict[str, float]:
    """Each quantized kernel candidate alone on every linear layer: how much of the loss
    is the weights' format and how much the activations' (native kernels quantize them
    per row, dynamic ones per tensor, weight-only ones keep bf16 or fp32)."""
    out = {}
    folder = model_folder(gguf)
    for mode, name in ((QuantMode.INT8, "int8_weight_only_fp32"),
                       (QuantMode.INT8, "int8_weight_only_bf16"),
                       (QuantMode.INT8, "int8_dynamic_fbgemm"), (QuantMode.INT8, "int8_native"),
                       (QuantMode.INT4, "int4_weight_only_bf16"), (QuantMode.INT4, "int4_native")):
        model = load_model(folder)
        with torch.inference_mode():
            for parent in list(model.modules()):
                for child_name, child in list(parent.named_children()):
                    if isinstance(child, nn.Linear):
                        # The dynamic kernel is no longer a candidate: built directly.
                        kernel = (DynamicInt8Kernel(child.weight.detach(), child.bias, "fbgemm")
                                  if name == "int8_dynamic_fbgemm"
                                  else _build(mode, name, child, 16, 32)[0])
                        setattr(parent, child_name, SelectedLinear(
                            kernel, kernel, 2**62, child.in_features, child.out_features))
        out[name] = perplexity(model, ids, window=window)
        print(name, out[name], flush=True)
    return out


def _cpu() -> dict[str, object]:
    """The CPU as the project's hardware probe names it, with its ISA features."""
    cpu = profile(engines=False, gpus=False).cpu
    return {"cpu": cpu.model_name, "isa": sorted(cpu.features)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--llamacpp-python", default=None)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--output", default="gguf_perplexity.json")
    parser.add_argument("--no-per-kernel", action="store_true",
                        help="leave out each quantized kernel alone (the slow part)")
    args = parser.parse_args()
    result: dict[str, object] = {"gguf": args.gguf.name, "modules": MODULES,
                                 "window": args.window}
    ids: list[int] = []
    ppl: dict[str, float] = {}
    for quant in ("none", "int8", "int4", "q8"):
        llm = LLM(args.gguf, quant=quant, config=EngineConfig(quant_group_size=32))
        if not ids:
            ids = llm.tokenizer.encode(text())[:args.tokens]
        ppl[{"none": "fp32"}.get(quant, quant)] = perplexity(llm.model, ids, window=args.window)
        print(quant, ppl, flush=True)
    result["turboinfer"] = ppl
    if not args.no_per_kernel:
        result["turboinfer_per_kernel"] = per_kernel(args.gguf, ids, args.window)
    result["tokens"] = len(ids)
    if args.llamacpp_python:
        with tempfile.TemporaryDirectory() as tmp:
            result["llama_cpp"], files = llama_cpp(args, ids, Path(tmp))
            result["turboinfer_on_llama_cpp_files"] = same_files(files, ids, args.window)
    result["ratios_to_fp32"] = {k: v / ppl["fp32"] for k, v in ppl.items()}
    result["machine"] = {**_cpu(), "python": platform.python_version()}
    result["command"] = " ".join(["python", "benchmarks/llm/gguf_perplexity.py",
                                  *sys.argv[1:]])
    (HERE / args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))



if __name__ == "__main__":
    main()
