"""``turboinfer llm generate|bench``: text generation and throughput of the LLM engine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turboinfer.commands._args import comma_list, non_negative_int, positive_int
from turboinfer.commands._llm_load import add_load_parser
from turboinfer.commands._llm_serve import add_serve_parser
from turboinfer.errors import InvalidInputError
from turboinfer.output import format_table, print_json

if TYPE_CHECKING:
    from turboinfer.llm import LLM

NAME = "llm"
HELP = "generate text with the paged-KV LLM engine, or benchmark it"

# EngineConfig's, SamplingParams' and BenchSettings' defaults, repeated (tests check they
# agree): importing turboinfer.llm loads torch, too slow for every `turboinfer --help`.
ENGINE_DEFAULTS = {"num_speculative_tokens": 6, "speculative_max_batch": 8,
                   "quant_group_size": 32, "block_size": 16, "kv_cache_tokens": 0,
                   "device": "cpu", "dtype": "auto", "backend": "auto",
                   "gpu_memory_utilization": 0.9}
SAMPLING_DEFAULTS = {"max_tokens": 64, "top_k": 0}
BENCH_DEFAULTS = {"concurrency": (1, 4, 16), "prompt_len": 64, "gen_len": 64}

BENCH_COLUMNS = ("concurrency", "tokens_per_s", "tokens_per_s_per_request", "ttft_p50_ms",
                 "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "peak_blocks",
                 "kv_slots_unused_pct", "acceptance_rate", "tokens_per_target_forward")


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="Hugging Face-format model folder or GGUF file (default: the "
                             "shipped demo)")
    spec = parser.add_mutually_exclusive_group()
    spec.add_argument("--draft", default=None, metavar="DRAFT_DIR",
                      help="draft model folder for speculative decoding ('demo' for the "
                           "shipped draft)")
    spec.add_argument("--ngram", type=positive_int, default=0, metavar="K",
                      help="draft-free speculative decoding with prompt-lookup n-grams up to K")
    parser.add_argument("--num-speculative", type=positive_int,
                        default=ENGINE_DEFAULTS["num_speculative_tokens"],
                        help="most tokens proposed per step when speculating (a lone greedy "
                             "request's rounds take the k up to it with the most expected "
                             "tokens per second on this machine)")
    parser.add_argument("--fixed-speculative", action="store_true",
                        help="propose --num-speculative tokens every round (prompt lookup: "
                             "as many as its match asks for)")
    parser.add_argument("--speculative-max-batch", type=positive_int,
                        default=ENGINE_DEFAULTS["speculative_max_batch"],
                        help="speculate only while at most this many requests decode together")
    parser.add_argument("--quant", choices=["none", "int8", "int4", "q8", "fp8"], default=None,
                        help="quantization of the linear layers: int8 per output channel, "
                        "int4 in groups, q8 int8 in groups of 32 with an fp16 scale "
                        "(llama.cpp's Q8_0), all weight-only; fp8 (general path: a GPU's "
                        "float8 tensor cores) float8 weights per output channel and "
                        "activations per row; default none, but a GGUF file "
                        "of Q4_0/Q4_1 or Q8_0 blocks runs its own (int4 or q8, the blocks "
                        "as they are)")
    parser.add_argument("--group-size", type=int, choices=[32, 64, 128, 256],
                        default=ENGINE_DEFAULTS["quant_group_size"],
                        help="int4 group size along the input channels")
    parser.add_argument("--block-size", type=positive_int,
                        default=ENGINE_DEFAULTS["block_size"],
                        help="tokens per KV-cache block")
    parser.add_argument("--kv-cache-tokens", type=non_negative_int,
                        default=ENGINE_DEFAULTS["kv_cache_tokens"],
                        help="KV-cache capacity in tokens, over all requests (0: 16384 on "
                             "the CPU, the device memory free after the weights on CUDA)")
    # The command line goes to the GPU where there is one; the library (EngineConfig)
    # stays on the CPU unless asked.
    parser.add_argument("--device", default="auto",
                        metavar="cpu|cuda|auto",
                        help="where the weights, the KV cache and sampling live (auto: "
                             "the GPU when there is one); cuda[:N] picks a GPU")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"],
                        default=ENGINE_DEFAULTS["dtype"],
                        help="the weights' dtype (auto: float32 on the CPU, bfloat16 on "
                             "CUDA)")
    parser.add_argument("--backend", choices=["auto", "torch", "graphs"],
                        default=ENGINE_DEFAULTS["backend"],
                        help="what runs the steps: auto (measured: the CPU's native and "
                             "lean paths, CUDA graphs on a GPU), torch (every step on the "
                             "general torch path), graphs (decode steps as CUDA graphs)")
    parser.add_argument("--gpu-memory-utilization", type=float,
                        default=ENGINE_DEFAULTS["gpu_memory_utilization"], metavar="SHARE",
                        help="on CUDA: the share of the memory free after the weights "
                             "that the KV cache and a step's activations may take")
    parser.add_argument("--expert-memory-gb", type=float, default=0.0, metavar="GIB",
                        help="MoE models: keep at most this many GiB of experts in memory "
                             "and load the others from the checkpoint on demand (0: all "
                             "resident)")
    parser.add_argument("--expert-cache-policy", choices=["layer", "lru"], default="layer",
                        help="with --expert-memory-gb: which expert a full cache drops (layer: "
                             "the one whose layer runs furthest ahead)")
    parser.add_argument("--no-expert-prefetch", action="store_true",
                        help="with --expert-memory-gb: load experts only when a layer "
                             "needs them, not ahead from the previous layer's routing")
    parser.add_argument("--tensor-parallel", type=positive_int, default=1, metavar="N",
                        help="split attention heads and MLP channels over N processes")
    parser.add_argument("--expert-parallel", type=positive_int, default=1, metavar="N",
                        help="MoE models: split the experts over N processes (equal to "
                             "--tensor-parallel when both are given)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: the count measured fastest at load, among 1 "
                             "up to the cores this process may use)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="llm_command", metavar="ACTION", required=True)
    gen = sub.add_parser("generate", help="generate text, streaming it to the terminal")
    _add_model_options(gen)
    gen.add_argument("--prompt", required=True, help="the text to continue")
    gen.add_argument("--max-tokens", type=int, default=SAMPLING_DEFAULTS["max_tokens"],
                     help="tokens to generate at most")
    # Softer than SamplingParams' plain sampling (temperature 1, top-p 1): the small demo
    # model reads better so. The help shows both values, so nobody is surprised.
    gen.add_argument("--temperature", type=float, default=0.8,
                     help="0: greedy; SamplingParams' own default is 1.0")
    gen.add_argument("--top-p", type=float, default=0.95,
                     help="nucleus sampling mass; SamplingParams' own default is 1.0")
    gen.add_argument("--top-k", type=int, default=SAMPLING_DEFAULTS["top_k"],
                     help="keep only the K likeliest tokens (0: off)")
    gen.add_argument("--seed", type=int, default=None,
                     help="a fixed seed makes the output repeatable")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.set_defaults(_llm_run=_generate)

    bench = sub.add_parser("bench", help="throughput and latency at several concurrencies")
    _add_model_options(bench)
    bench.add_argument("--concurrency", type=comma_list(positive_int),
                       default=BENCH_DEFAULTS["concurrency"],
                       help="requests in flight together, one run per level")
    bench.add_argument("--prompt-len", type=positive_int, default=BENCH_DEFAULTS["prompt_len"],
                       help="prompt tokens per request")
    bench.add_argument("--gen-len", type=positive_int, default=BENCH_DEFAULTS["gen_len"],
                       help="generated tokens per request")
    bench.add_argument("--mixed", action="store_true",
                       help="draw each request's lengths from [len/4, len]")
    bench.add_argument("--roofline", action="store_true",
                       help="also measure memory read bandwidth and compare batch-1 decode "
                            "with the bandwidth limit of the loaded weights")
    bench.add_argument("--json", action="store_true", help="machine-readable output")
    bench.set_defaults(_llm_run=_bench)
    add_load_parser(sub)
    add_serve_parser(sub, _add_model_options, _build)
    convert = sub.add_parser("convert", help="a GGUF file to a Hugging Face-format folder")
    convert.add_argument("gguf", type=Path, help="the .gguf file")
    convert.add_argument("-o", "--output", type=Path, required=True,
                         help="the folder to write (config.json, model.safetensors, "
                              "tokenizer)")
    convert.set_defaults(_llm_run=_convert)


def run(args: argparse.Namespace) -> int:
    return int(args._llm_run(args))


def _build(args: argparse.Namespace, **engine: Any) -> LLM:
    # Here and in the functions below, not at the top: turboinfer.llm loads torch.
    from turboinfer.llm import LLM, EngineConfig, demo_model_dir

    config = EngineConfig(block_size=args.block_size, kv_cache_tokens=args.kv_cache_tokens,
                          num_speculative_tokens=args.num_speculative,
                          adapt_speculative_tokens=not args.fixed_speculative,
                          speculative_max_batch=args.speculative_max_batch,
                          num_threads=max(args.threads, 0), quant_group_size=args.group_size,
                          expert_memory_gb=args.expert_memory_gb,
                          expert_prefetch=not args.no_expert_prefetch,
                          expert_cache_policy=args.expert_cache_policy,
                          tensor_parallel=args.tensor_parallel,
                          expert_parallel=args.expert_parallel, device=args.device,
                          dtype=args.dtype, backend=args.backend,
                          gpu_memory_utilization=args.gpu_memory_utilization, **engine)
    draft = demo_model_dir("draft") if args.draft == "demo" else args.draft
    return LLM(args.model, draft=draft, ngram=args.ngram, quant=args.quant, config=config)


def _convert(args: argparse.Namespace) -> int:
    from turboinfer.llm.model.gguf import convert_gguf  # why: loads torch

    if not args.gguf.is_file():
        raise InvalidInputError(f"{args.gguf}: no such GGUF file")
    folder = convert_gguf(args.gguf, args.output)
    print(f"wrote {folder}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from turboinfer.llm import SamplingParams  # why: turboinfer.llm loads torch

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            stop=tuple(args.stop))
    llm = _build(args)
    sys.stdout.write(args.prompt)
    for piece in llm.stream(args.prompt, params):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    stats = llm.engine.spec_stats
    if stats.drafted:
        print(f"speculative: acceptance {stats.acceptance_rate:.2f}, "
              f"{stats.tokens_per_forward:.2f} tokens per target forward", file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    import torch  # why: torch off --help

    from turboinfer.llm.bench import BenchSettings, roofline, run_bench  # why: loads torch
    from turboinfer.llm.placement import placement_report  # why: loads torch

    llm = _build(args)
    concurrency = tuple(args.concurrency)
    if args.roofline and 1 not in concurrency:
        concurrency = (1, *concurrency)  # the roofline is about batch-1 decode
    settings = BenchSettings(concurrency=concurrency, prompt_len=args.prompt_len,
                             gen_len=args.gen_len, mixed=args.mixed)
    results = run_bench(llm.engine, settings)
    rows = [r.to_dict() for r in results]
    # The mean context of a batch-1 decode step: the prompt and half the new tokens.
    roof = (roofline(llm.engine, next(r for r in results if r.concurrency == 1),
                     context_tokens=args.prompt_len + args.gen_len // 2)
            if args.roofline else None)
    threads = torch.get_num_threads()
    runner = llm.engine.runner
    native = runner.native_decoder()        # None off the CPU: no lean step there
    f32_fetch = native.f32_prefetch if native is not None else None
    spec = llm.engine.spec_length
    placed = placement_report(llm.model, llm.config, sum(r.output_tokens for r in results))
    llm.placement.close()
    if args.json:
        print_json({"model": str(args.model or "demo"), "quant": llm.config.quant.value,
                    "quant_source": llm.quant_source,
                    "draft": args.draft, "ngram": args.ngram, "threads": threads,
                    "thread_choice": (llm.thread_choice.to_dict() if llm.thread_choice
                                      else None),
                    "kernels": [c.to_dict() for c in llm.kernel_choices],
                    "prefetch": (llm.prefetch_choice.to_dict() if llm.prefetch_choice
                                 else None),
                    "f32_prefetch": f32_fetch.to_dict() if f32_fetch else None,
                    "speculation": spec.to_dict() if spec else None,
                    "decode_path": llm.engine.runner.decode_path(),
                    "device": llm.config.device, "dtype": llm.config.dtype,
                    "backend": llm.config.backend,
                    "device_decode": (runner.device_choice.to_dict()
                                      if runner.device_choice else None),
                    "quant_layers": llm.quant_layers,
                    "memory_plan": llm.engine.memory_plan.to_dict(),
                    "results": rows, **placed,
                    **({"roofline": roof.to_dict()} if roof else {})})
        return 0
    print(format_table(BENCH_COLUMNS, [[row[c] for c in BENCH_COLUMNS] for row in rows]))
    how = ("as asked" if not llm.thread_choice else "remembered"
           if llm.thread_choice.remembered else "measured fastest")
    print(f"\nthreads: {threads} ({how}); kernels (shape, rows: chosen):")
    for c in llm.kernel_choices:
        sliced = (f" (timed on its first {c.timed_out_features} rows)"
                  if c.timed_out_features else "")
        kept = " (remembered)" if c.remembered else ""
        print(f"  {c.out_features}x{c.in_features} x{c.layers}, {c.rows} rows: "
              f"{c.chosen}{sliced}{kept}")
    if llm.prefetch_choice:
        for kind, timings in llm.prefetch_choice.step_ms.items():
            timed = ", ".join(f"{d} B {ms:.2f} ms" for d, ms in timings.items())
            print(f"{kind} weight prefetch: {llm.prefetch_choice.chosen[kind]} bytes ahead "
                  f"(one-row products: {timed})")
    if f32_fetch:
        timed = ", ".join(f"{d} B {ms:.2f} ms" for d, ms in f32_fetch.step_ms["f32"].items())
        print(f"fp32 several-row setting: {f32_fetch.chosen['f32']} (4 and 7 rows: {timed})")
    if spec:
        costs = ", ".join(f"{ms:.2f}" for ms in spec.round_ms)
        used = ", ".join(f"k={k}: {n}" for k, n in enumerate(spec.rounds_by_k) if n)
        print(f"tokens proposed per round: by measured round cost (k=0..{spec.max_k}: "
              f"{costs} ms) and counted agreement; rounds {used or 'none yet'}")
    kind = llm.config.dtype if llm.config.quant.value == "none" else llm.config.quant.value
    layers = llm.quant_layers.get("target") or {}
    on_device = (f"; {layers['kernel']} layers on torch's kernel, {layers['dequant']} "
                 "dequantized" if sum(layers.values()) else "")
    print(f"weights: {kind} ({llm.quant_source}){_sixteen_bit(llm.kernel_choices)}"
          f"{on_device}")
    print(f"batch-1 decode step: {llm.engine.runner.decode_path()} on {llm.config.device} "
          f"({llm.config.dtype})")
    plan = llm.engine.memory_plan
    print(f"memory: weights {plan.weights_bytes / 2**20:.1f} MiB, KV cache "
          f"{plan.kv_bytes / 2**20:.1f} MiB = {plan.num_blocks} blocks of "
          f"{plan.block_size} tokens ({plan.max_tokens} tokens; {plan.source})")
    if roof:
        where = "device" if roof.device == "cuda" else f"{roof.threads} threads"
        print(f"\nroofline (batch 1): read bandwidth {roof.bandwidth_gb_s:.1f} GB/s "
              f"({where}), {roof.weight_bytes_per_token / 1e6:.1f} MB of weights + "
              f"{roof.kv_bytes_per_token / 1e6:.2f} MB of KV cache per token, limit "
              f"{roof.roofline_tokens_per_s:.1f} tokens/s, achieved "
              f"{roof.achieved_tokens_per_s:.1f} ({100 * roof.fraction:.0f}%)")
    return 0


def _sixteen_bit(choices: list[Any]) -> str:
    """How many layers' one-row kernel keeps its weights in 16 bits (fp32 arithmetic on
    a half-precision checkpoint's numbers); empty where none does."""
    from turboinfer.llm.backends.cpu.kernel_candidates import NativeHalfKernel  # why: torch

    types = {name: str(dtype).removeprefix("torch.")
             for dtype, name in NativeHalfKernel.NAMES.items()}
    ones = [c for c in choices if c.rows == 1]
    kept = {types[c.chosen] for c in ones if c.chosen in types}
    layers = sum(c.layers for c in ones if c.chosen in types)
    if not layers:
        return ""
    return (f"; {layers} of {sum(c.layers for c in ones)} layers kept in 16 bits "
            f"({', '.join(sorted(kept))}), fp32 arithmetic")
