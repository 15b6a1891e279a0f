"""Loading a half-precision checkpoint: seconds and peak memory of ``load_model``, this
checkout against a git revision, side by side.

    python benchmarks/llm/load_memory.py [--baseline REV] [--rounds 2] [--engine]
        [--output load_memory.json]

The checkpoint is a random-weight Llama of the Llama-3.2-1B shape (16 layers of 2048, 32
heads, 8 key-value heads, vocabulary 128,256, tied embeddings) saved in bf16 by
``transformers`` (2.5 GB), built once under /tmp. Each measurement is a fresh process that
imports the loader of one checkout (``--baseline`` checked out into a temporary
worktree) and loads the folder to float32 weights; the record is its wall time and the
process's peak resident set (``ru_maxrss``: the checkpoint's file pages the loader
touched count in it, though the kernel can drop them). The checkouts alternate.

``--engine`` measures ``LLM(folder)`` at one thread instead, everything an engine does
before its first request (``load_model``, then the measured kernel selection that builds
each layer's kernels), with the demo model's tokenizer copied into the folder, and
records the first 8 greedy tokens of one prompt so the checkouts' engines can be
compared. ``--engine --dtype bfloat16`` loads it on the general path in that dtype (the
path a GPU runs, here on the CPU: the torch backend, no kernel selection).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from native_kernels import machine  # noqa: E402

FOLDER = Path("/tmp/turboinfer-load-memory/llama-1b-bf16")

MEASURE = """
import json, resource, sys, time
start = time.perf_counter()
from turboinfer.llm.model.loader import load_model
model = load_model(sys.argv[1])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds,
                  "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""


MEASURE_ENGINE = """
import json, resource, sys, time
start = time.perf_counter()
from turboinfer.llm import LLM, EngineConfig, SamplingParams
dtype = sys.argv[2] if len(sys.argv) > 2 else None
llm = LLM(sys.argv[1], config=EngineConfig(num_threads=1), dtype=dtype,
          backend="torch" if dtype else None)
seconds = time.perf_counter() - start
out = llm.generate([1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
print(json.dumps({"seconds": seconds,
                  "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "parameters": sum(p.numel() for p in llm.model.parameters()),
                  "tokens": list(out[0].token_ids)}))
"""


def checkpoint() -> Path:
    if (FOLDER / "model.safetensors").exists():
        return FOLDER
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=500000.0)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(FOLDER, safe_serialization=True)
    return FOLDER


def with_tokenizer(folder: Path) -> Path:
    """The engine needs a tokenizer: the demo model's (its 2,048 ids are all in range)."""
    from turboinfer.llm.api import demo_model_dir

    if not (folder / "tokenizer.json").exists():
        shutil.copy(demo_model_dir() / "tokenizer.json", folder / "tokenizer.json")
    return folder


def measure(src: Path, folder: Path, script: str = MEASURE, *extra: str) -> dict[str, Any]:
    # Kernel choices measured in every process, none read back from an earlier one: the
    # selection's time is part of what --engine measures.
    env = {**os.environ, "PYTHONPATH": str(src), "TURBOINFER_KERNEL_CACHE": "off"}
    done = subprocess.run([sys.executable, "-c", script, str(folder), *extra], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="a git revision to load with beside this checkout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine", action="store_true",
                        help="measure LLM(folder), kernel selection included")
    parser.add_argument("--dtype", default=None,
                        help="with --engine: load in this dtype on the general path")
    parser.add_argument("--output", default="load_memory.json")
    args = parser.parse_args()
    folder = with_tokenizer(checkpoint()) if args.engine else checkpoint()
    script = MEASURE_ENGINE if args.engine else MEASURE
    sources = {"this checkout": ROOT / "src"}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach",
                            f"{tmp}/base", args.baseline], check=True)
            sources[f"@{args.baseline}"] = Path(tmp) / "base" / "src"
        try:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
            for r in range(args.rounds):
                for name in (list(sources) if r % 2 == 0 else list(sources)[::-1]):
                    runs[name].append(measure(sources[name], folder, script,
                                             *([args.dtype] if args.dtype else [])))
                    print(name, runs[name][-1], flush=True)
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                f"{tmp}/base"], check=True)
    summary = {name: {"seconds": statistics.median(r["seconds"] for r in rs),
                      "peak_rss_gib": statistics.median(r["peak_rss_gib"] for r in rs),
                      "parameters": rs[0]["parameters"],
                      **({"tokens": rs[0]["tokens"]} if "tokens" in rs[0] else {})}
               for name, rs in runs.items()}
    measured = "LLM(folder), 1 thread" if args.engine else "load_model(folder)"
    if args.engine and args.dtype:
        measured += f", dtype {args.dtype}, torch backend"
    record = {"machine": machine(), "command": " ".join(sys.argv),
              "measured": measured,
              "checkpoint": "random Llama-3.2-1B shape, bf16, 2.5 GB (transformers)",
              "summary": summary, "runs": runs}
    (HERE / args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
