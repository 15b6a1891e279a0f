"""GPU acceptance of the LLM engine, in one run: decode, prefill, agreement, quantization.

For the shipped demo model and a random-weight Llama of about 1B parameters built from
a ``transformers`` config (the Llama-3.2-1B shape; nothing is downloaded), each on
``--device`` in ``--dtype``:

1. the engine's memory plan (weights, KV-cache bytes and blocks, tokens it holds) and how
   its decode steps run (CUDA graphs or the general path, with the measured step times);
2. decode time per output token (p50) at batch 1, 8 and 32 (prompt 128, 128 new tokens),
   and the weight bytes read per second at batch 1 (weights / TPOT: the bandwidth
   roofline's numerator; an H200 reads about 4.8 TB/s);
3. prefill tokens/s (8 prompts of 512 tokens, one new token each);
4. greedy agreement with ``transformers`` on the same device (64 new tokens; in
   ``--dtype`` and, unless --quick, in float32) and ``transformers`` eager generate's
   batch-1 time per token beside the engine's;
5. weight-only int8 and int4 (group 32) and fp8 (float8 weights and activations on
   Hopper's tensor cores): decode TPOT at batch 1 and 8, the layers on torch's kernels
   vs the dequantizing fallback, and perplexity against the unquantized model on fixed
   text (the demo's held-out docstrings from the standard library, the
   corpus the demo was trained on).

Every figure is printed and one JSON written (--out). A section that fails records its
error and the run goes on.

On the GPU machine (Python 3.12, torch 2.11 + CUDA 13, transformers; no network), from
the checkout's root, with the wheels the project lacks there fetched beforehand on a
networked machine by `../shared/gpu/fetch-wheels.sh wheels` into the checkout's
git-ignored `wheels/`:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site wheels/*.whl
    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/gpu/llm_acceptance.py \
        --out benchmarks/gpu/llm_acceptance.json          # at most about 5 minutes

On a CPU (the same code paths, smaller: a 4-layer random Llama, batches 1 and 8, short
prompts): PYTHONPATH=src python benchmarks/gpu/llm_acceptance.py --device cpu --quick
(under 2 minutes).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import shutil
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir
from turboinfer.llm.bench import (
    BenchSettings,
    bench_level,
    measure_device_bandwidth,
    measure_read_bandwidth,
    roofline,
)
from turboinfer.llm.perplexity import perplexity
from turboinfer.llm.tokenizer import Tokenizer

# The Llama-3.2-1B shape (1.24B parameters, tied embeddings), context cut to 4096.
LLAMA_1B = {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 64, "max_position_embeddings": 4096, "rope_theta": 500000.0,
            "tie_word_embeddings": True}
# The Llama-3.1-8B shape (8.0B parameters, untied), context cut to 4096 and its RoPE
# scaling left out (speed is what is measured here, on random weights).
LLAMA_8B = {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": 4096, "rope_theta": 500000.0,
            "tie_word_embeddings": False}
LLAMA_QUICK = {"vocab_size": 2048, "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
               "head_dim": 32, "max_position_embeddings": 1024, "rope_theta": 10000.0,
               "tie_word_embeddings": False}
LLAMA_QUICK_BIG = {**LLAMA_QUICK, "hidden_size": 384, "intermediate_size": 1024,
                   "num_attention_heads": 12, "num_key_value_heads": 4}
SECTIONS = ("bandwidth", "agreement", "llama_1b", "llama_8b", "demo", "quant")


def plan(quick: bool) -> dict[str, Any]:
    if quick:
        return {"batches": [1, 8], "prompt_len": 32, "gen_len": 16, "prefill": (4, 64),
                "agree_tokens": 24, "ppl_tokens": 512, "quant_batches": [1],
                "shape": LLAMA_QUICK, "big_shape": LLAMA_QUICK_BIG, "big_batches": [1, 8]}
    return {"batches": [1, 8, 32], "prompt_len": 128, "gen_len": 128, "prefill": (8, 512),
            "agree_tokens": 64, "ppl_tokens": 4096, "quant_batches": [1, 8],
            "shape": LLAMA_1B, "big_shape": LLAMA_8B, "big_batches": [1, 64]}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release() -> None:
    """Drop what a finished section held: the next engine sizes its KV cache from the
    device memory free then."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Sections:
    """Runs the sections asked for, in order, while the time budget lasts: one that
    fails records its error and the run goes on; one past the budget is recorded as
    skipped (a GPU lease is short: what ran must come back)."""

    def __init__(self, results: dict[str, Any], wanted: set[str], budget_s: float) -> None:
        self.results = results
        self.wanted = wanted
        self.deadline = time.perf_counter() + budget_s if budget_s > 0 else float("inf")

    def run(self, name: str, fn: Callable[[], Any]) -> None:
        if name.split("_float32")[0] not in self.wanted:
            return
        if time.perf_counter() > self.deadline:
            self.results[name] = {"skipped": "the time budget (--budget-s) ran out"}
            print(f"[{name}] skipped: the time budget ran out", flush=True)
            return
        start = time.perf_counter()
        try:
            self.results[name] = fn()
        except Exception as exc:  # one failed section must not lose the others' figures
            traceback.print_exc()
            self.results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        release()
        print(f"[{name}] {time.perf_counter() - start:.1f} s: "
              f"{json.dumps(self.results[name])[:600]}", flush=True)


def bandwidth(device: torch.device) -> dict[str, float]:
    """The device memory's measured bandwidth (bytes/s), the roofline's denominator."""
    if device.type == "cuda":
        return measure_device_bandwidth(device)
    return measure_read_bandwidth(1)


def build_random_llama(folder: Path, shape: dict[str, Any], device: torch.device,
                       dtype: torch.dtype) -> Any:
    """A random-weight ``transformers`` Llama of ``shape``, saved with the demo's
    tokenizer (the engine needs one; the benchmark feeds token ids). Initialised on the
    device: a 1B model's random init on the host takes a minute."""
    import transformers

    config = transformers.LlamaConfig(**shape, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    # Made in ``dtype`` from the start: an 8B model in float32 first would hold 32 GB.
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(demo_model_dir() / "tokenizer.json", folder / "tokenizer.json")
    return model


def engine(folder: Path, args: argparse.Namespace, *, quant: str = "none",
           dtype: str | None = None) -> LLM:
    # One host thread on a CPU run: it checks the code paths, and on a shared machine a
    # descheduled intra-op thread stalls every op of the torch path.
    threads = 1 if args.device == "cpu" else 0
    return LLM(folder, quant=quant, device=args.device, dtype=dtype or args.dtype,
               backend=args.backend, config=EngineConfig(max_num_seqs=64,
                                                         num_threads=threads))


def decode_rows(llm: LLM, p: dict[str, Any], batches: list[int], *,
                with_roofline: bool = False) -> dict[str, Any]:
    """Decode at each batch size (p50 time per output token, and the decode rate: batch
    x 1000 / TPOT); with the roofline of batch 1 (weights and KV read per token against
    the measured bandwidth of the device)."""
    settings = BenchSettings(prompt_len=p["prompt_len"], gen_len=p["gen_len"])
    eng = llm.engine
    bench_level(eng, BenchSettings(prompt_len=8, gen_len=4), 1)   # warm-up, untimed
    rows, first = {}, None
    for b in batches:
        row = bench_level(eng, settings, b)
        first = row if b == 1 else first
        rows[str(b)] = {"tpot_p50_ms": row.tpot_p50_ms, "tpot_p99_ms": row.tpot_p99_ms,
                        "tokens_per_s": row.tokens_per_s, "ttft_p50_ms": row.ttft_p50_ms,
                        "decode_tokens_per_s": (b * 1000 / row.tpot_p50_ms
                                                if row.tpot_p50_ms else None)}
    tpot1 = rows.get("1", {}).get("tpot_p50_ms")
    weights = eng.memory_plan.weights_bytes
    out: dict[str, Any] = {
        "decode": rows,
        "weights_read_gb_s_batch1": (weights / (tpot1 / 1000) / 1e9) if tpot1 else None}
    top = str(max(batches))
    if tpot1 and top != "1" and rows[top]["decode_tokens_per_s"]:
        out[f"decode_rate_batch{top}_vs_batch1"] = (rows[top]["decode_tokens_per_s"]
                                                    / rows["1"]["decode_tokens_per_s"])
    if with_roofline and first is not None:
        out["roofline"] = roofline(eng, first, context_tokens=p["prompt_len"]
                                   + p["gen_len"] // 2).to_dict()
    return out


def prefill_rate(llm: LLM, prompts: int, length: int) -> dict[str, float]:
    eng = llm.engine
    vocab = eng.model.config.vocab_size
    ids = [[(37 * i + 11 * j + 5) % (vocab - 1) + 1 for j in range(length)]
           for i in range(prompts)]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    # Warm-up: one prompt of the same length (the first forward pays allocations).
    llm.generate(ids[0][::-1], params)
    sync(eng.device)
    start = time.perf_counter()
    llm.generate(ids, params)
    sync(eng.device)
    seconds = time.perf_counter() - start
    return {"prompts": prompts, "prompt_len": length, "seconds": seconds,
            "tokens_per_s": prompts * length / seconds}


def model_report(name: str, folder: Path, args: argparse.Namespace,
                 p: dict[str, Any]) -> dict[str, Any]:
    llm = engine(folder, args)
    runner = llm.engine.runner
    out: dict[str, Any] = {
        "model": name, "device": llm.config.device, "dtype": llm.config.dtype,
        "parameters": sum(t.numel() for t in llm.model.parameters()),
        "memory_plan": llm.engine.memory_plan.to_dict(),
    }
    out.update(decode_rows(llm, p, p["batches"], with_roofline=True))
    out["prefill"] = prefill_rate(llm, *p["prefill"])
    out["decode_path"] = runner.decode_path()
    out["device_decode"] = runner.device_choice.to_dict() if runner.device_choice else None
    graphs = runner._graphs
    out["graphs_captured"] = graphs.num_graphs if graphs is not None else 0
    return out


def hf_greedy(model: Any, prompt: list[int], new: int, device: torch.device,
              ) -> tuple[list[int], float]:
    """transformers' eager greedy generate: its tokens and seconds per new token."""
    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                       pad_token_id=0)   # warm-up
        sync(device)
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0)
        sync(device)
    return [int(t) for t in out[0, len(prompt):]], (time.perf_counter() - start) / new


class TokenClock:
    """A ``transformers`` streamer that notes when each new token reaches the host (the
    first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt = True

    def put(self, value: Any) -> None:
        if self._prompt:
            self._prompt = False
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        """generate's last call: every time is noted already."""


def hf_decode(model: Any, prompt: list[int], new: int, device: torch.device, *,
              compiled: bool) -> dict[str, Any]:
    """transformers' greedy generate at batch 1: p50 time between new tokens, after one
    untimed run of the same length (which compiles, when ``compiled``). ``compiled``:
    its fastest configuration, a static cache with the decode step under torch.compile
    (mode reduce-overhead: CUDA graphs), which generate applies on a GPU by itself."""
    ids = torch.tensor([prompt], device=device)
    kwargs: dict[str, Any] = {"max_new_tokens": new, "min_new_tokens": new,
                              "do_sample": False, "pad_token_id": 0}
    if compiled:
        from transformers import CompileConfig

        kwargs |= {"cache_implementation": "static",
                   "compile_config": CompileConfig(fullgraph=True, mode="reduce-overhead")}
    start = time.perf_counter()
    model.generate(ids, **kwargs)
    sync(device)
    warmup = time.perf_counter() - start
    clock = TokenClock()
    model.generate(ids, streamer=clock, **kwargs)
    sync(device)
    gaps = [b - a for a, b in zip(clock.times, clock.times[1:], strict=False)]
    return {"tpot_p50_ms": 1000 * statistics.median(gaps), "tokens": len(clock.times),
            "warmup_s": warmup, "static_cache": compiled,
            # generate compiles on accelerators only (a CPU run checks the calls).
            "compiled": compiled and device.type == "cuda"}


def big_report(folder: Path, args: argparse.Namespace, p: dict[str, Any],
               device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The Llama-3.1-8B shape at batch 1 against transformers (eager, and static cache +
    torch.compile) and the roofline, then the engine at the widest batch."""
    start = time.perf_counter()
    hf = build_random_llama(folder, p["big_shape"], device, dtype)
    out: dict[str, Any] = {"built_s": time.perf_counter() - start}
    vocab = p["big_shape"]["vocab_size"]
    prompt = [(29 * j + 3) % (vocab - 1) + 1 for j in range(p["prompt_len"])]
    out["transformers_eager"] = hf_decode(hf, prompt, p["gen_len"], device, compiled=False)
    try:
        out["transformers_static_compile"] = hf_decode(hf, prompt, p["gen_len"], device,
                                                       compiled=True)
    except Exception as exc:   # the engine's figures still count
        traceback.print_exc()
        out["transformers_static_compile"] = {"error": f"{type(exc).__name__}: {exc}"}
    del hf
    # The compiled generate's CUDA graphs hold the weights and their pool: dropped, so
    # that the engine's memory plan sees the device as a user's process would.
    torch._dynamo.reset()
    release()
    out.update(model_report("llama_8b", folder, args, {**p, "batches": p["big_batches"]}))
    tpot1 = out["decode"]["1"]["tpot_p50_ms"]
    for key in ("transformers_eager", "transformers_static_compile"):
        theirs = out[key].get("tpot_p50_ms")
        if theirs and tpot1:
            out[f"speed_vs_{key}"] = theirs / tpot1
    return out


def agreement(hf_model: Any, folder: Path, args: argparse.Namespace, p: dict[str, Any],
              dtype: str) -> dict[str, Any]:
    device = torch.device(args.device) if args.device != "auto" else None
    llm = engine(folder, args, dtype=dtype)
    dev = llm.engine.device
    torch_dtype = llm.dtype
    hf = hf_model.to(dev, torch_dtype)
    vocab = llm.model.config.vocab_size
    prompt = [(13 * j + 7) % (vocab - 1) + 1 for j in range(32)]
    new = p["agree_tokens"]
    want, hf_tpot = hf_greedy(hf, prompt, new, device or dev)
    got = list(llm.generate(prompt, SamplingParams(max_tokens=new, temperature=0,
                                                   ignore_eos=True))[0].token_ids)
    prefix = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), new)
    return {"dtype": dtype, "tokens": new, "equal_positions": sum(
        a == b for a, b in zip(got, want, strict=True)), "equal_prefix": prefix,
        "transformers_eager_tpot_ms": 1000 * hf_tpot}


def run_agreements(sections: Sections, hf_model: Any, folder: Path,
                   args: argparse.Namespace, p: dict[str, Any], dtype: torch.dtype) -> None:
    """In the engine's dtype and, on a GPU run, in float32 too."""
    name = str(dtype).removeprefix("torch.")
    sections.run("agreement", lambda: agreement(hf_model, folder, args, p, name))
    if not args.quick and dtype != torch.float32:
        sections.run("agreement_float32",
                     lambda: agreement(hf_model, folder, args, p, "float32"))


def quant_report(folder: Path, demo: Path, args: argparse.Namespace,
                 p: dict[str, Any]) -> dict[str, Any]:
    text = (demo.parent / "heldout.txt").read_text()
    out: dict[str, Any] = {}
    for mode in ("none", "int8", "int4", "fp8"):
        res: dict[str, Any] = {}
        llm = engine(folder, args, quant=mode)
        res["layers"] = llm.quant_layers.get("target")
        res.update(decode_rows(llm, {**p, "gen_len": min(p["gen_len"], 64)},
                               p["quant_batches"]))
        ids = Tokenizer.from_folder(folder).encode(text)[:p["ppl_tokens"]]
        res["perplexity_1b"] = perplexity(llm.model, ids, window=256)
        del llm
        release()
        small = engine(demo, args, quant=mode)
        demo_ids = small.tokenizer.encode(text)[:p["ppl_tokens"]]
        res["perplexity_demo"] = perplexity(small.model, demo_ids, window=256)
        del small
        release()
        out[mode] = res
    for mode in ("int8", "int4", "fp8"):
        for key in ("perplexity_1b", "perplexity_demo"):
            out[mode][key + "_increase_pct"] = 100 * (out[mode][key] / out["none"][key] - 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cpu or auto")
    parser.add_argument("--dtype", default="auto",
                        help="the engine's dtype (auto: bfloat16 on CUDA, float32 on the CPU)")
    parser.add_argument("--backend", default=None,
                        help="the engine's backend (default: auto on a GPU; torch on the "
                             "CPU, the general path a GPU runs, not the CPU's native one)")
    parser.add_argument("--quick", action="store_true",
                        help="a small random Llama, batches 1 and 8, short prompts")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"which to run, in this order: {','.join(SECTIONS)} (default: "
                             "all; llama_8b is the Llama-3.1-8B shape's batch-1 and "
                             "batch-64 decode beside transformers)")
    parser.add_argument("--budget-s", type=float, default=0,
                        help="start no section after this many seconds (0: no limit)")
    parser.add_argument("--out", type=Path, default=Path("llm_acceptance.json"))
    args = parser.parse_args()
    wanted = {name.strip() for name in args.sections.split(",") if name.strip()}
    if wanted - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(wanted - set(SECTIONS)))}")
    if args.backend is None:
        args.backend = "torch" if args.device == "cpu" else "auto"
    p = plan(args.quick)
    begin = time.perf_counter()
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                    "gpu": (torch.cuda.get_device_name() if torch.cuda.is_available()
                            else None)},
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {
            k: v for k, v in p.items() if not k.endswith("shape")} | {
            "shape": p["shape"], "big_shape": p["big_shape"]},
    }
    sections = Sections(results, wanted, args.budget_s)

    def save() -> None:   # after every model: a run cut short keeps what it measured
        results["seconds"] = time.perf_counter() - begin
        args.out.write_text(json.dumps(results, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="llm_acceptance_") as tmp:
        folder = Path(tmp) / "llama"
        probe = LLM(demo_model_dir(), device=args.device, dtype=args.dtype,
                    backend=args.backend, config=EngineConfig(num_blocks=4))
        device, dtype = probe.engine.device, probe.dtype
        del probe
        release()
        sections.run("bandwidth", lambda: bandwidth(device))
        if wanted & {"agreement", "llama_1b", "quant"}:
            hf_model = build_random_llama(folder, p["shape"], device, dtype)
            results["settings"]["built_in_s"] = time.perf_counter() - begin
            run_agreements(sections, hf_model, folder, args, p, dtype)
            del hf_model
            release()
            sections.run("llama_1b", lambda: model_report("llama_1b", folder, args, p))
            save()
        big = Path(tmp) / "llama_8b"
        sections.run("llama_8b", lambda: big_report(big, args, p, device, dtype))
        shutil.rmtree(big, ignore_errors=True)
        save()
        sections.run("demo", lambda: model_report("demo", demo_model_dir(), args, p))
        sections.run("quant", lambda: quant_report(folder, demo_model_dir(), args, p))
    save()
    print(f"wrote {args.out} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
