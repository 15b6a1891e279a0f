"""The hand-written C kernels (``llm/backends/cpu/native``) against torch's, side by side in one
run:
turboinfer fp32, int8 and int4 each with the native candidates offered and without them
(``TURBOINFER_NATIVE_KERNELS=0``), beside llama.cpp Q8_0 / Q4_0 and CTranslate2 int8 /
fp32, on compare.py's random 110M Llama, greedy, one thread.

    python benchmarks/llm/native_kernels.py [--rounds 3]      # writes native_kernels.json
    python benchmarks/llm/native_kernels.py --int8-rows [--baseline REV]
                                                    # writes native_int8_rows.json
    python benchmarks/llm/native_kernels.py --f32-rows [--baseline REV]
                                                    # writes native_f32_rows.json

Every engine is one worker process (compare.py's workers and line protocol), loaded
once; per round, in an order that rotates, each runs batch 1 (a 64-token prompt, 64
generated) and batch 16 (16 such prompts at once), new prompts every round. Recorded:
wall and CPU time per call, the per-round ratios, the bandwidth roofline of batch-1
decode (read bandwidth measured every round, bytes per token as each worker loaded its
kernels), the kernel chosen per shape with every candidate's timing, greedy ids of the
native runs against the torch-kernel runs of the same format, perplexity of every format
on each kind of kernel, the load average.

``--int8-rows`` times kernels alone instead: the native int8 kernel (and its AMX form where
AMX runs) against fbgemm's
dynamic int8 linear (and, with ``--baseline``, the native kernel as ``kernels.c`` stood at
that git revision) on the model's linear shapes at 1, 16, 64 and 512 rows, in interleaved
rounds on one thread, each round's time per call and the per-round ratios recorded, then
what the load-time measurement (``llm/backends/cpu/kernels.py``) picks per shape at 1 and 16 rows.

``--quant-rows --baseline REV`` times the native int8 and int4 kernels against themselves as
``kernels.c`` stood at ``REV`` (writes native_quant_rows.json), on SmolLM2-135M's linear
shapes and the demo model's at 1 and 16 rows (``--rows``), interleaved as above.

``--f32-rows`` does the same for the native fp32 kernel at the few rows of a speculative
verification (1-16), on the demo model's shapes and the 110M model's, against torch's
``F.linear`` and, with ``--baseline``, ``kernels.c`` of that revision; each timing is
also given as G multiply-adds per second, the figure to hold against the FMA peak
(``--hot``: one copy of each weight, in cache, so that the arithmetic alone is timed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))

from compare import (  # noqa: E402  (compare.py sits beside this script)
    BATCH,
    GEN_LEN,
    MODEL,
    PROMPT_LEN,
    Engine,
    Worker,
    engines,
    make_prompts,
    matching_prefix,
)

DISABLE_ENV = "TURBOINFER_NATIVE_KERNELS"
PEERS = ("llama.cpp Q8_0", "llama.cpp Q4_0", "CTranslate2 int8", "CTranslate2 fp32")


def workers_for(threads: int) -> list[Worker]:
    project = Path(sys.executable)
    worker = str(HERE / "workers" / "turboinfer_worker.py")
    out = []
    for quant, label in (("none", "fp32"), ("int8", "int8"), ("int4", "int4")):
        for native in (True, False):
            engine = Engine("turboinfer", f"{label} {'native' if native else 'torch'}",
                            project, (worker, str(MODEL), str(threads), quant))
            previous = os.environ.pop(DISABLE_ENV, None)
            if not native:
                os.environ[DISABLE_ENV] = "0"
            try:
                out.append(Worker.for_engine(engine))     # the worker inherits os.environ
            finally:
                os.environ.pop(DISABLE_ENV, None)
                if previous is not None:
                    os.environ[DISABLE_ENV] = previous
    out += [Worker.for_engine(e) for e in engines(threads) if f"{e.name} {e.weights}" in PEERS]
    return out


def summarize(rounds: list[dict[str, Any]], infos: dict[str, dict[str, Any]],
              ) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for key in rounds[0]["runs"]:
        runs = [r["runs"][key] for r in rounds]
        row: dict[str, Any] = {
            "b1_tps": statistics.median(GEN_LEN / x["b1"]["wall_s"] for x in runs),
            "b1_tps_cpu": statistics.median(GEN_LEN / x["b1"]["cpu_s"] for x in runs),
            "b16_tps": statistics.median(BATCH * GEN_LEN / x["b16"]["wall_s"] for x in runs),
            "b16_tps_cpu": statistics.median(BATCH * GEN_LEN / x["b16"]["cpu_s"]
                                             for x in runs),
        }
        info = infos[key]
        if "bytes_per_token" in info:
            decode = [(GEN_LEN - 1) / (x["b1"]["wall_s"] - x["b1"]["ttft_s"]) for x in runs]
            row["b1_decode_tps"] = statistics.median(decode)
            row["bytes_per_token"] = info["bytes_per_token"]
            row["roofline_tps"] = (statistics.median(r["bandwidth"] for r in rounds)
                                   / info["bytes_per_token"])
            row["roofline_fraction"] = statistics.median(
                d * info["bytes_per_token"] / r["bandwidth"]
                for d, r in zip(decode, rounds, strict=True))
            # The linear layers alone, from the timings taken at load: the sum over
            # shapes of layers x the chosen kernel's ms, and the bandwidth that implies.
            for rows in (1, 16):
                row[f"linear_ms_per_step_b{rows}"] = sum(
                    k["layers"] * k["timings_ms"][k["chosen"]] for k in info["kernels"]
                    if k["rows"] == rows)
            row["linear_gb_s_b1"] = info["bytes_per_token"] / row["linear_ms_per_step_b1"] / 1e6
            row["kernels_chosen"] = sorted({f"{k['out_features']}x{k['in_features']} "
                                            f"@{k['rows']}: {k['chosen']}"
                                            for k in info["kernels"]})
        summary[key] = row
    return summary


def ratios(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per-round speed ratios (den's wall time over num's: > 1 means num is faster)."""
    pairs = []
    for fmt in ("fp32", "int8", "int4"):
        for metric in ("b1", "b16"):
            pairs.append((f"turboinfer {fmt} native", f"turboinfer {fmt} torch", metric))
    pairs += [("turboinfer int8 native", "llama.cpp Q8_0", "b1"),
              ("turboinfer int8 torch", "llama.cpp Q8_0", "b1"),
              ("turboinfer int4 native", "llama.cpp Q4_0", "b1"),
              ("turboinfer int4 torch", "llama.cpp Q4_0", "b1"),
              ("turboinfer fp32 native", "CTranslate2 fp32", "b1"),
              ("turboinfer int8 native", "CTranslate2 int8", "b16"),
              ("turboinfer int8 torch", "CTranslate2 int8", "b16"),
              ("turboinfer int4 native", "CTranslate2 int8", "b16")]
    out = {}
    for num, den, metric in pairs:
        if num not in rounds[0]["runs"] or den not in rounds[0]["runs"]:
            continue
        for clock in ("wall_s", "cpu_s"):
            vals = [r["runs"][den][metric][clock] / r["runs"][num][metric][clock]
                    for r in rounds]
            out[f"{num} / {den} ({metric}, {clock[:-2]})"] = {
                "median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def perplexities(threads: int) -> dict[str, dict[str, float]]:
    """Perplexity of the demo model (trained) on the shipped held-out text, 8192 tokens,
    each format on its native kernels only and on torch's only (the candidate lists
    narrowed, so that the measurement cannot pick the other kind), and plain fp32."""
    import torch

    from turboinfer.llm import demo_model_dir
    from turboinfer.llm.backends.cpu import kernel_candidates
    from turboinfer.llm.backends.cpu.kernels import select_kernels
    from turboinfer.llm.model.config import QuantMode
    from turboinfer.llm.model.loader import load_model
    from turboinfer.llm.perplexity import perplexity
    from turboinfer.llm.tokenizer import Tokenizer

    torch.set_num_threads(threads)
    folder = demo_model_dir()
    text = (folder.parent / "heldout.txt").read_text()
    tokens = Tokenizer.from_folder(folder).encode(text)[:8192]
    plain = perplexity(load_model(folder), tokens, window=256)
    out: dict[str, dict[str, float]] = {"fp32 plain": {"perplexity": plain, "vs_fp32_pct": 0.0}}
    torch_cands, native_cands = (kernel_candidates._torch_candidates,
                                 kernel_candidates._native_candidates)
    try:
        for kind in ("native", "torch"):
            kernel_candidates._torch_candidates = (  # type: ignore[assignment]
                torch_cands if kind == "torch" else lambda mode, group: [])
            kernel_candidates._native_candidates = (  # type: ignore[assignment]
                native_cands if kind == "native" else lambda mode, group: [])
            for mode in QuantMode:
                model = load_model(folder)
                select_kernels(model, mode)
                ppl = perplexity(model, tokens, window=256)
                out[f"{mode.value} {kind}"] = {"perplexity": ppl,
                                               "vs_fp32_pct": 100 * (ppl / plain - 1)}
    finally:
        kernel_candidates._torch_candidates = torch_cands  # type: ignore[assignment]
        kernel_candidates._native_candidates = native_cands  # type: ignore[assignment]
    return out


# The 110M model's linear shapes (out, in): fused qkv, o, fused gate/up, down, LM head.
INT8_SHAPES = {"qkv": (1280, 768), "o": (768, 768), "gate_up": (4096, 768),
               "down": (768, 2048), "lm_head": (32000, 768)}


def _time_shape(builders: dict[str, Any], weight: Any, x: Any, rows: int,
                rounds: int) -> dict[str, Any]:
    """Each builder's kernel on ``weight`` (rotated copies), timed on ``x`` in interleaved
    rounds: the load average when timing began, the copies, the samples and their
    medians (ms)."""
    kernels = {name: _rotated(build, weight, rows) for name, build in builders.items()}
    load = os.getloadavg()
    samples = _interleaved(kernels, x, rounds)
    return {"load_average": load, "copies": {n: len(c) for n, c in kernels.items()},
            "median_ms": {n: statistics.median(s) for n, s in samples.items()},
            "samples_ms": samples}


def _ratio(numerator: list[float], denominator: list[float]) -> dict[str, float]:
    """Round by round ``numerator / denominator`` times: median, lowest and highest."""
    vals = [a / b for a, b in zip(numerator, denominator, strict=True)]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def baseline_library(rev: str) -> Any:
    """The native library with ``kernels.c`` as it stood at git revision ``rev`` (and
    today's ``decode.c`` and ``threads.c``, which only call into it), compiled with the
    loader's flags."""
    import tempfile

    from turboinfer.llm.backends.cpu.native.loader import (
        FLAGS,
        HEADERS,
        SOURCES,
        NativeLibrary,
    )

    root = HERE.parents[1]
    folder = Path(tempfile.mkdtemp(prefix="ti-int8-baseline-"))
    source = folder / "kernels.c"
    source.write_text(subprocess.run(
        ["git", "show", f"{rev}:src/turboinfer/llm/backends/cpu/native/kernels.c"], cwd=root,
        capture_output=True, text=True, check=True).stdout)
    for header in HEADERS:      # today's declarations, for a kernels.c that includes them
        (folder / header.name).write_bytes(header.read_bytes())
    library = folder / "kernels.so"
    subprocess.run([os.environ.get("CC") or "cc", *FLAGS, "-o", str(library), str(source),
                    *(str(path) for path in SOURCES[1:]), "-lm"], check=True)
    return NativeLibrary(library)


def _write_rows_result(args: argparse.Namespace, started: float, load_start: Any,
                       **fields: Any) -> None:
    """``--int8-rows`` and ``--f32-rows``: the run's record (machine, commits, load) and
    ``fields``, to ``args.out``."""
    import torch

    def commit(rev: str) -> str:
        return subprocess.run(["git", "rev-parse", "--short", rev], cwd=HERE, text=True,
                              capture_output=True).stdout.strip()

    result = {"machine": machine(), "torch": torch.__version__, "threads": 1,
              "command": " ".join(sys.argv), "commit": commit("HEAD"),
              "baseline": args.baseline and commit(args.baseline),
              "load_average_start": load_start, "load_average_end": os.getloadavg(),
              "seconds": time.time() - started, "rounds": args.rounds, **fields}
    args.out.write_text(json.dumps(result, indent=1) + "\n")


def _rotated(build: Any, weight: Any, rows: int, hot: bool = False) -> list[Any]:
    """One kernel and as many copies of it as the load-time measurement rotates through,
    so that calls read the weights from memory as a model's layers do (``hot``: one copy,
    the weights in cache: the arithmetic alone)."""
    import math

    from turboinfer.llm.backends.cpu.kernels import MAX_COPIES, PREFILL_ROWS, last_level_cache_bytes

    first = build(weight)
    copies = (1 if hot or rows >= PREFILL_ROWS else min(
        MAX_COPIES, math.ceil(2 * last_level_cache_bytes() / first.read_bytes)))
    return [first] + [build(weight) for _ in range(copies - 1)]


def _interleaved(kernels: dict[str, list[Any]], x: Any, rounds: int) -> dict[str, list[float]]:
    """ms per call of each kernel, one sample per round, the order rotating per round."""
    reps = {}
    for name, copies in kernels.items():
        for kernel in copies:
            kernel(x)
        start = time.perf_counter()
        copies[0](x)
        reps[name] = max(len(copies), int(0.02 / (time.perf_counter() - start)))
    samples: dict[str, list[float]] = {name: [] for name in kernels}
    for i in range(rounds):
        order = list(kernels)[i % len(kernels):] + list(kernels)[:i % len(kernels)]
        for name in order:
            start = time.perf_counter()
            for j in range(reps[name]):
                kernels[name][j % len(kernels[name])](x)
            samples[name].append(1e3 * (time.perf_counter() - start) / reps[name])
    return samples


def int8_rows(args: argparse.Namespace) -> None:
    """Kernel against kernel on one thread: see the module docstring."""
    import torch

    from turboinfer.llm.backends.cpu.kernel_candidates import (
        DynamicInt8Kernel,
        NativeAmxInt8Kernel,
        NativeInt8Kernel,
        candidates,
    )
    from turboinfer.llm.backends.cpu.kernels import measure_shape
    from turboinfer.llm.backends.cpu.native import native_status
    from turboinfer.llm.model.config import QuantMode

    torch.set_num_threads(1)
    lib = native_status().library
    if lib is None:
        raise SystemExit(f"no native library: {native_status().reason}")
    builders = {"int8_native": lambda w: NativeInt8Kernel(lib, w, None),
                "int8_dynamic_fbgemm": lambda w: DynamicInt8Kernel(w, None, "fbgemm")}
    if lib.has_amx:
        builders["int8_amx_native"] = lambda w: NativeAmxInt8Kernel(lib, w, None)
    if args.baseline:
        before = baseline_library(args.baseline)
        builders[f"int8_native@{args.baseline}"] = lambda w: NativeInt8Kernel(before, w, None)
    started, load_start = time.time(), os.getloadavg()
    gen = torch.Generator().manual_seed(0)
    results: list[dict[str, Any]] = []
    for shape, (n, k) in INT8_SHAPES.items():
        weight = torch.randn(n, k, generator=gen) * k ** -0.5
        for rows in args.rows:
            timed = _time_shape(builders, weight, torch.randn(rows, k, generator=gen),
                                rows, args.rounds)
            samples = timed["samples_ms"]
            ratios = {f"int8_dynamic_fbgemm / {name}":
                      _ratio(samples["int8_dynamic_fbgemm"], samples[name])
                      for name in samples if name != "int8_dynamic_fbgemm"}
            row = {"shape": shape, "out_features": n, "in_features": k, "rows": rows,
                   **timed, "ratios": ratios}
            results.append(row)
            print(f"{shape:8s} {n}x{k} rows {rows:4d}: " + "  ".join(
                f"{n_} {v:.3f} ms" for n_, v in row["median_ms"].items()) + "  " + "  ".join(
                f"{n_}: {r['median']:.2f}x" for n_, r in ratios.items()), flush=True)
    selection = []
    cands = candidates(QuantMode.INT8)
    for shape, (n, k) in INT8_SHAPES.items():
        weight = torch.randn(n, k, generator=gen) * k ** -0.5
        for rows in (1, 16):
            choice = measure_shape(cands, weight, None, rows, QuantMode.INT8)
            selection.append({"shape": shape, **choice.to_dict()})
            print(f"load-time choice {shape} @{rows}: {choice.chosen} " + ", ".join(
                f"{n_} {v:.3f}" for n_, v in choice.timings_ms.items()), flush=True)
    _write_rows_result(args, started, load_start, kernels=results,
                       load_time_selection=selection)


# The demo model's linear shapes (hidden 256, FFN 768, vocab 2048) beside the 110M one's.
F32_SHAPES = {**{f"demo {name}": shape for name, shape in (
    ("qkv", (512, 256)), ("o", (256, 256)), ("gate_up", (1536, 256)), ("down", (256, 768)),
    ("lm_head", (2048, 256)))}, **{f"110M {name}": shape for name, shape in INT8_SHAPES.items()}}


# SmolLM2-135M's (hidden 576, FFN 1536, 9 query and 3 KV heads of 64, vocab 49152): q / o,
# k / v, gate / up, down, the LM head; fused as the engine fuses them; the demo model's.
QUANT_SHAPES = {**{f"smollm2 {name}": shape for name, shape in (
    ("q/o", (576, 576)), ("k/v", (192, 576)), ("gate/up", (1536, 576)), ("down", (576, 1536)),
    ("lm_head", (49152, 576)), ("qkv", (960, 576)), ("gate_up", (3072, 576)))},
    **{f"demo {name}": shape for name, shape in (
        ("qkv", (512, 256)), ("o", (256, 256)), ("gate_up", (1536, 256)), ("down", (256, 768)),
        ("lm_head", (2048, 256)))}}


def quant_rows(args: argparse.Namespace) -> None:
    """The native int8 and int4 kernels against ``--baseline``: see the module docstring."""
    import torch

    from turboinfer.llm.backends.cpu.kernel_candidates import NativeInt4Kernel, NativeInt8Kernel
    from turboinfer.llm.backends.cpu.native import native_status

    if not args.baseline:
        raise SystemExit("--quant-rows needs --baseline REV")
    torch.set_num_threads(1)
    lib = native_status().library
    if lib is None:
        raise SystemExit(f"no native library: {native_status().reason}")
    before = baseline_library(args.baseline)
    started, load_start = time.time(), os.getloadavg()
    gen = torch.Generator().manual_seed(0)
    results: list[dict[str, Any]] = []
    for fmt, cls in (("int8", NativeInt8Kernel), ("int4", NativeInt4Kernel)):
        new, old = f"{fmt}_native", f"{fmt}_native@{args.baseline}"
        builders = {new: lambda w, c=cls: c(lib, w, None),
                    old: lambda w, c=cls: c(before, w, None)}
        for shape, (n, k) in QUANT_SHAPES.items():
            weight = torch.randn(n, k, generator=gen) * k ** -0.5
            for rows in args.rows:
                timed = _time_shape(builders, weight, torch.randn(rows, k, generator=gen),
                                    rows, args.rounds)
                ratio = _ratio(timed["samples_ms"][old], timed["samples_ms"][new])
                results.append({"format": fmt, "shape": shape, "out_features": n,
                                "in_features": k, "rows": rows, **timed,
                                f"{old} / {new}": ratio})
                print(f"{fmt} {shape:16s} {n}x{k} rows {rows:3d}: " + "  ".join(
                    f"{n_} {v:.4f} ms" for n_, v in timed["median_ms"].items())
                    + f"  before/after {ratio['median']:.3f}x "
                    f"({ratio['min']:.3f}-{ratio['max']:.3f})", flush=True)
    from turboinfer.hardware import profile

    cpu = profile(engines=False, gpus=False).cpu
    _write_rows_result(args, started, load_start, cpu_isa=sorted(cpu.features),
                       simd_level={"after": lib.simd_level, "before": before.simd_level},
                       kernels=results)


def f32_rows(args: argparse.Namespace) -> None:
    """The native fp32 kernel at 1-16 rows: see the module docstring."""
    import torch

    from turboinfer.llm.backends.cpu.kernel_candidates import LinearKernel, NativeF32Kernel
    from turboinfer.llm.backends.cpu.native import native_status

    torch.set_num_threads(1)
    lib = native_status().library
    if lib is None:
        raise SystemExit(f"no native library: {native_status().reason}")
    builders: dict[str, Any] = {"fp32_native": lambda w: NativeF32Kernel(lib, w, None),
                                "fp32_torch": lambda w: LinearKernel(w, None)}
    reference = "fp32_torch"
    if args.baseline:
        before = baseline_library(args.baseline)
        reference = f"fp32_native@{args.baseline}"
        builders[reference] = lambda w: NativeF32Kernel(before, w, None)
    started, load_start = time.time(), os.getloadavg()
    gen = torch.Generator().manual_seed(0)
    results: list[dict[str, Any]] = []
    for shape, (n, k) in F32_SHAPES.items():
        weight = torch.randn(n, k, generator=gen) * k ** -0.5
        for rows in args.rows:
            x = torch.randn(rows, k, generator=gen)
            kernels = {name: _rotated(build, weight, rows, args.hot)
                       for name, build in builders.items()}
            load = os.getloadavg()
            samples = _interleaved(kernels, x, args.rounds)
            ratios = {}
            for name in kernels:
                if name != reference:
                    vals = [r / v for v, r in zip(samples[name], samples[reference],
                                                  strict=True)]
                    ratios[f"{reference} / {name}"] = {
                        "median": statistics.median(vals), "min": min(vals), "max": max(vals)}
            median = {n_: statistics.median(s) for n_, s in samples.items()}
            row = {"shape": shape, "out_features": n, "in_features": k, "rows": rows,
                   "load_average": load, "copies": {n_: len(c) for n_, c in kernels.items()},
                   "median_ms": median,
                   "gmac_s": {n_: rows * n * k / v / 1e6 for n_, v in median.items()},
                   "samples_ms": samples, "ratios": ratios}
            results.append(row)
            print(f"{shape:12s} {n}x{k} rows {rows:3d}: " + "  ".join(
                f"{n_} {v:.4f} ms ({row['gmac_s'][n_]:.1f} G)" for n_, v in median.items())
                + "  " + "  ".join(f"{n_}: {r['median']:.2f}x" for n_, r in ratios.items()),
                flush=True)
            del kernels

    _write_rows_result(args, started, load_start,
                       weights="one copy, in cache" if args.hot else "rotated through copies",
                       kernels=results)


def machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
              for line in lscpu.splitlines() if ":" in line}
    model = fields.get("Model name", platform.processor())
    # "AMD EPYC" alone does not say the generation: family 25 is Zen 3 / Zen 4, 26 Zen 5.
    return {"cpu": model, "cpu_family": fields.get("CPU family"), "cpu_model": fields.get("Model"),
            "logical_cpus": os.cpu_count(), "python": platform.python_version()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="3 for the engines, 7 for --int8-rows")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--int8-rows", action="store_true",
                        help="time the int8 kernels alone per shape and row count")
    parser.add_argument("--f32-rows", action="store_true",
                        help="time the fp32 kernels alone per shape at a verification's rows")
    parser.add_argument("--quant-rows", action="store_true",
                        help="time the native int8 and int4 kernels against --baseline")
    parser.add_argument("--hot", action="store_true",
                        help="--f32-rows with one copy of each weight (cache-resident)")
    parser.add_argument("--rows", type=int, nargs="+",
                        help="row counts for --int8-rows (1 16 64 512) or --f32-rows "
                             "(1 2 3 4 5 7 9 16)")
    parser.add_argument("--baseline",
                        help="git revision whose kernels.c --int8-rows or --f32-rows adds")
    args = parser.parse_args()
    if args.f32_rows:
        args.out = args.out or HERE / "native_f32_rows.json"
        args.rounds = args.rounds or 7
        args.rows = args.rows or [1, 2, 3, 4, 5, 7, 9, 16]
        f32_rows(args)
        return
    if args.quant_rows:
        args.out = args.out or HERE / "native_quant_rows.json"
        args.rounds = args.rounds or 7
        args.rows = args.rows or [1, 16]
        quant_rows(args)
        return
    args.rows = args.rows or [1, 16, 64, 512]
    if args.int8_rows:
        args.out = args.out or HERE / "native_int8_rows.json"
        args.rounds = args.rounds or 7
        int8_rows(args)
        return
    args.out = args.out or HERE / "native_kernels.json"
    args.rounds = args.rounds or 3
    import torch

    from turboinfer.llm.backends.cpu.native import native_status
    from turboinfer.llm.bench import measure_read_bandwidth

    status = native_status()
    started, load_start = time.time(), os.getloadavg()
    workers = workers_for(args.threads)
    infos = {w.key: w.info for w in workers}
    for w in workers:   # warm-up: first calls pay one-off allocations
        w.generate(make_prompts(2, 16, 0), 4)
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = workers[i % len(workers):] + workers[:i % len(workers)]
        b1_prompts = make_prompts(1, PROMPT_LEN, 100 * i + 1)
        b16_prompts = make_prompts(BATCH, PROMPT_LEN, 100 * i + 16)
        rnd: dict[str, Any] = {"load_average": os.getloadavg(),
                               "bandwidth": measure_read_bandwidth(args.threads)["bandwidth"],
                               "runs": {}}
        for w in order:
            rnd["runs"][w.key] = {"b1": w.generate(b1_prompts, GEN_LEN),
                                  "b16": w.generate(b16_prompts, GEN_LEN)}
            run = rnd["runs"][w.key]
            print(f"round {i + 1}: {w.key} b1 {GEN_LEN / run['b1']['wall_s']:.1f} tok/s, "
                  f"b16 {BATCH * GEN_LEN / run['b16']['wall_s']:.1f}", file=sys.stderr,
                  flush=True)
        rounds.append(rnd)
    for w in workers:
        w.close()
    ppl = perplexities(args.threads)
    same_ids = {}
    for fmt in ("fp32", "int8", "int4"):
        nat, ref = rounds[-1]["runs"][f"turboinfer {fmt} native"], \
            rounds[-1]["runs"][f"turboinfer {fmt} torch"]
        same_ids[fmt] = {"b1": matching_prefix(nat["b1"]["ids"][0], ref["b1"]["ids"][0]),
                         "b16": sum(matching_prefix(a, b) for a, b in
                                    zip(nat["b16"]["ids"], ref["b16"]["ids"], strict=True))}
    result = {
        "machine": machine(), "torch": torch.__version__, "threads": args.threads,
        "native_library": {"isa": status.library.isa if status.library else None,
                           "reason_absent": status.reason},
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "seconds": time.time() - started, "prompt_len": PROMPT_LEN, "gen_len": GEN_LEN,
        "batch": BATCH, "summary": summarize(rounds, infos), "ratios": ratios(rounds),
        "greedy_ids_native_equal_torch": same_ids, "perplexity_demo": ppl,
        "kernels": {k: v.get("kernels") for k, v in infos.items() if "kernels" in v},
        "rounds": [{**r, "runs": {k: {m: {f: v for f, v in x.items() if f != "ids"}
                                      for m, x in run.items()}
                                  for k, run in r["runs"].items()}} for r in rounds],
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for key, row in result["summary"].items():
        extra = (f", roofline {100 * row['roofline_fraction']:.0f}% of "
                 f"{row['roofline_tps']:.0f}; linear layers {row['linear_ms_per_step_b1']:.1f}"
                 f" ms/token at b1 ({row['linear_gb_s_b1']:.1f} GB/s), "
                 f"{row['linear_ms_per_step_b16']:.1f} ms/step at b16"
                 if "roofline_fraction" in row else "")
        print(f"{key:28s} b1 {row['b1_tps']:6.1f} tok/s ({row['b1_tps_cpu']:6.1f}/CPU-s), "
              f"b16 {row['b16_tps']:6.1f} ({row['b16_tps_cpu']:6.1f}/CPU-s){extra}")
    for name, r in result["ratios"].items():
        print(f"{name}: {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})")
    for name, p in ppl.items():
        print(f"perplexity {name}: {p['perplexity']:.3f} ({p['vs_fp32_pct']:+.2f}%)")


if __name__ == "__main__":
    main()
