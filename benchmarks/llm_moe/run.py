"""MoE expert offload and tensor parallelism on this machine, compared in interleaved
rounds. Results go to benchmarks/llm_moe/results.json (README.md reads them).

offload: a random Mixtral-style model (8 experts, top-2) whose experts exceed the
    budget: all experts resident vs a cache holding half of them, with and without
    prefetch, under each cache policy (layer-aware, LRU); tokens/s, hit rate, prefetch
    accuracy, bytes loaded per token.
tp: a random dense Llama-style model decoded by 1 process x 1 thread, 1 process x 2
    threads and 2 processes x 1 thread (tensor parallel 2, gloo); plus the all-reduce
    latency of one step's activations between 2 processes and the read bandwidth, the
    numbers the README's cost model uses.

    python benchmarks/llm_moe/run.py [--sections offload,tp] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from turboinfer.llm.bench import measure_read_bandwidth
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.model.config import EngineConfig
from turboinfer.llm.model.experts import (
    GIB,
    CachePolicy,
    expert_cache,
    load_offloaded_model,
    reset_moe_stats,
)
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.parallel import ParallelGroup
from turboinfer.llm.parallel.collectives import BROADCASTS, AllReduce, free_port, init_group

HERE = Path(__file__).resolve().parent
WORK = Path(os.environ.get("TURBOINFER_BENCH_DIR", "/tmp/turboinfer_bench_llm_moe"))

MOE_SHAPE = {"vocab_size": 2048, "hidden_size": 512, "intermediate_size": 1024,
             "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
             "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 1024}
DENSE_SHAPE = {"vocab_size": 4096, "hidden_size": 1024, "intermediate_size": 4096,
               "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8,
               "max_position_embeddings": 1024}


def save_random(folder: Path, kind: str) -> Path:
    """A random model from its transformers config (weights std 1/sqrt(hidden))."""
    if (folder / "model.safetensors").is_file():
        return folder
    import transformers  # why: only to build the random checkpoint once

    if kind == "mixtral":
        cfg, cls, shape = transformers.MixtralConfig, transformers.MixtralForCausalLM, MOE_SHAPE
    else:
        cfg, cls, shape = transformers.LlamaConfig, transformers.LlamaForCausalLM, DENSE_SHAPE
    torch.manual_seed(0)
    model = cls(cfg(**shape, bos_token_id=None, eos_token_id=None, pad_token_id=None))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, shape["hidden_size"] ** -0.5)
    model.save_pretrained(folder)
    return folder


def generate(engine: LLMEngine, concurrency: int, prompt_len: int, gen_len: int,
             seed: int) -> tuple[int, float, float]:
    """(output tokens, wall seconds, this process's CPU seconds, all threads) for
    ``concurrency`` greedy requests run together."""
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.model.config.vocab_size
    params = SamplingParams(max_tokens=gen_len, temperature=0, ignore_eos=True)
    begin, cpu = time.perf_counter(), time.process_time()
    seqs = [engine.add_request(torch.randint(1, vocab, (prompt_len,), generator=gen).tolist(),
                               params) for _ in range(concurrency)]
    while engine.has_unfinished():
        engine.step()
    return (sum(s.num_output_tokens for s in seqs), time.perf_counter() - begin,
            time.process_time() - cpu)


def engine_for(model: LlamaModel) -> LLMEngine:
    return LLMEngine(model, EngineConfig(kv_cache_tokens=4096, block_size=16))


def offload(args: argparse.Namespace) -> dict[str, Any]:
    folder = save_random(WORK / "mixtral", "mixtral")
    torch.set_num_threads(args.threads)
    hidden, inter = MOE_SHAPE["hidden_size"], MOE_SHAPE["intermediate_size"]
    expert_bytes = 3 * hidden * inter * 4
    total = MOE_SHAPE["num_hidden_layers"] * MOE_SHAPE["num_local_experts"]
    budget_gb = (total // 2) * expert_bytes / GIB
    variants = {"resident": engine_for(load_model(folder))}
    for policy in CachePolicy:
        for prefetch in (True, False):
            name = f"{policy.value}_{'prefetch' if prefetch else 'no_prefetch'}"
            variants[name] = engine_for(load_offloaded_model(folder, budget_gb,
                                                             prefetch=prefetch, policy=policy))
    for engine in variants.values():          # first forwards pay one-off costs
        generate(engine, 1, 8, 4, seed=99)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for concurrency in (1, 4):
            row: dict[str, Any] = {"round": r, "concurrency": concurrency,
                                   "load_average": os.getloadavg()}
            for name, engine in variants.items():
                reset_moe_stats(engine.model)
                tokens, seconds, cpu = generate(engine, concurrency, args.prompt_len,
                                                args.gen_len, seed=r)
                cell: dict[str, Any] = {"tokens_per_s": tokens / seconds,
                                        "tokens_per_cpu_s": tokens / cpu}
                cache = expert_cache(engine.model)
                if cache is not None:
                    s = cache.stats
                    cell.update(hit_rate=s.hit_rate, prefetch_accuracy=s.prefetch_accuracy,
                                prefetch_recall=s.prefetch_recall,
                                bytes_loaded_per_token=s.bytes_loaded / tokens,
                                misses=s.misses, hits=s.hits)
                row[name] = cell
            rounds.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    summary: dict[str, Any] = {}
    for concurrency in (1, 4):
        rows = [r for r in rounds if r["concurrency"] == concurrency]
        med = {name: statistics.median(r[name]["tokens_per_s"] for r in rows)
               for name in variants}
        med_cpu = {name: statistics.median(r[name]["tokens_per_cpu_s"] for r in rows)
                   for name in variants}
        ratio = {f"{name}_vs_resident": statistics.median(
            r[name]["tokens_per_s"] / r["resident"]["tokens_per_s"] for r in rows)
            for name in variants if name != "resident"}
        for policy in CachePolicy:
            p = policy.value
            ratio[f"{p}_prefetch_vs_{p}_no_prefetch"] = statistics.median(
                r[f"{p}_prefetch"]["tokens_per_s"] / r[f"{p}_no_prefetch"]["tokens_per_s"]
                for r in rows)
        summary[f"concurrency_{concurrency}"] = {
            "median_tokens_per_s": med, "median_tokens_per_cpu_s": med_cpu,
            "median_per_round_ratio": ratio,
            **{f"{name}_median_{k}": statistics.median(r[name][k] for r in rows)
               for name in variants if name != "resident"
               for k in ("hit_rate", "prefetch_accuracy", "prefetch_recall",
                         "bytes_loaded_per_token")}}
    return {"model": {**MOE_SHAPE, "expert_bytes": expert_bytes, "experts": total,
                      "all_experts_bytes": total * expert_bytes,
                      "budget_bytes": int(budget_gb * GIB), "budget_experts": total // 2},
            "threads": args.threads, "prompt_len": args.prompt_len, "gen_len": args.gen_len,
            "rounds": rounds, "summary": summary}


def allreduce_worker(port: int) -> None:
    """Rank 1 of the all-reduce latency probe (``--allreduce-rank1 PORT``)."""
    torch.set_num_threads(1)
    init_group(1, 2, port, torch.device("cpu"))
    sizes = [None]
    dist.broadcast_object_list(sizes, src=0)
    for rows, reps in sizes[0]:
        x = torch.ones(rows, DENSE_SHAPE["hidden_size"])
        for _ in range(reps):
            dist.all_reduce(x)
    dist.destroy_process_group()


def allreduce_latency() -> dict[str, float]:
    """Median microseconds of one all-reduce of [rows, hidden] fp32 between 2 processes."""
    port = free_port()
    worker = subprocess.Popen([sys.executable, __file__, "--allreduce-rank1", str(port)])
    init_group(0, 2, port, torch.device("cpu"))
    plan = [(1, 2000), (8, 2000)]
    dist.broadcast_object_list([plan], src=0)
    out = {}
    for rows, reps in plan:
        x = torch.ones(rows, DENSE_SHAPE["hidden_size"])
        times = []
        for _ in range(reps):
            begin = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - begin)
        out[f"rows_{rows}_us"] = 1e6 * statistics.median(times)
    dist.destroy_process_group()
    worker.wait(timeout=60)
    return out


def tp(args: argparse.Namespace) -> dict[str, Any]:
    folder = save_random(WORK / "llama", "llama")
    latency = allreduce_latency()
    bandwidth = {t: measure_read_bandwidth(t) for t in (1, 2)}
    torch.set_num_threads(1)
    config = EngineConfig(kv_cache_tokens=4096, block_size=16, num_threads=1)
    group = ParallelGroup(folder, dataclasses.replace(config, tensor_parallel=2))
    tp_engine = LLMEngine(group.model, config)
    group.attach(tp_engine)
    single = engine_for(load_model(folder))
    variants = {"1proc_1thread": (single, 1), "1proc_2threads": (single, 2),
                "tp2_1thread_each": (tp_engine, 1)}
    for engine, _ in variants.values():
        generate(engine, 1, 8, 4, seed=99)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for concurrency in (1, 8):
            row: dict[str, Any] = {"round": r, "concurrency": concurrency,
                                   "load_average": os.getloadavg()}
            for name, (engine, threads) in variants.items():
                torch.set_num_threads(threads)
                before = dataclasses.replace(AllReduce.stats)
                before_bcast = dataclasses.replace(BROADCASTS)
                tokens, seconds, _ = generate(engine, concurrency, args.prompt_len,
                                              args.gen_len, seed=r)
                cell: dict[str, Any] = {"tokens_per_s": tokens / seconds}
                if name.startswith("tp2"):
                    calls = AllReduce.stats.calls - before.calls
                    cell["all_reduce_ms_per_token"] = (
                        1000 * (AllReduce.stats.seconds - before.seconds) / tokens)
                    cell["all_reduces_per_step"] = calls / (tokens / concurrency)
                    cell["step_broadcast_ms_per_step"] = (
                        1000 * (BROADCASTS.seconds - before_bcast.seconds)
                        / max(BROADCASTS.calls - before_bcast.calls, 1))
                row[name] = cell
            rounds.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    group.close()
    weights = sum(p.numel() * p.element_size() for p in single.model.parameters())
    summary = {}
    for concurrency in (1, 8):
        rows = [r for r in rounds if r["concurrency"] == concurrency]
        summary[f"concurrency_{concurrency}"] = {
            "median_tokens_per_s": {n: statistics.median(r[n]["tokens_per_s"] for r in rows)
                                    for n in variants},
            "tp2_vs_1proc_2threads": statistics.median(
                r["tp2_1thread_each"]["tokens_per_s"] / r["1proc_2threads"]["tokens_per_s"]
                for r in rows),
            "tp2_vs_1proc_1thread": statistics.median(
                r["tp2_1thread_each"]["tokens_per_s"] / r["1proc_1thread"]["tokens_per_s"]
                for r in rows),
            "tp2_all_reduce_ms_per_token": statistics.median(
                r["tp2_1thread_each"]["all_reduce_ms_per_token"] for r in rows),
            "tp2_step_broadcast_ms_per_step": statistics.median(
                r["tp2_1thread_each"]["step_broadcast_ms_per_step"] for r in rows)}
    return {"model": {**DENSE_SHAPE, "weight_bytes": weights},
            "all_reduce_latency": latency, "read_bandwidth_gb_s": bandwidth,
            "prompt_len": args.prompt_len, "gen_len": args.gen_len,
            "rounds": rounds, "summary": summary}


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                 if line.startswith("Model name")), platform.processor())


def tables(results: dict[str, Any]) -> str:
    """The README's tables from results.json."""
    lines = []
    off = results.get("offload")
    if off:
        lines += ["| requests | variant | tokens/s | tokens/CPU-s | vs resident (per round) "
                  "| hit rate | prefetch accuracy | recall | MB loaded/token |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for level, s in off["summary"].items():
            for name, tps in s["median_tokens_per_s"].items():
                ratio = s["median_per_round_ratio"].get(f"{name}_vs_resident", 1.0)
                extra = (["-"] * 4 if name == "resident" else [
                    f"{s[f'{name}_median_hit_rate']:.2f}",
                    f"{s[f'{name}_median_prefetch_accuracy']:.2f}",
                    f"{s[f'{name}_median_prefetch_recall']:.2f}",
                    f"{s[f'{name}_median_bytes_loaded_per_token'] / 1e6:.1f}"])
                cpu = s.get("median_tokens_per_cpu_s", {}).get(name, float("nan"))
                lines.append(f"| {level.split('_')[1]} | {name} | {tps:.1f} | {cpu:.1f} | "
                             f"{ratio:.2f} | " + " | ".join(extra) + " |")
        lines.append("")
    tp_res = results.get("tp")
    if tp_res:
        lines += ["| requests | 1 proc x 1 thread | 1 proc x 2 threads | TP 2 x 1 thread | "
                  "TP2 / 1x2 | TP2 / 1x1 | all-reduce ms/token | broadcast ms/step |",
                  "|---|---|---|---|---|---|---|---|"]
        for level, s in tp_res["summary"].items():
            m = s["median_tokens_per_s"]
            lines.append(f"| {level.split('_')[1]} | {m['1proc_1thread']:.1f} | "
                         f"{m['1proc_2threads']:.1f} | {m['tp2_1thread_each']:.1f} | "
                         f"{s['tp2_vs_1proc_2threads']:.2f} | {s['tp2_vs_1proc_1thread']:.2f} | "
                         f"{s['tp2_all_reduce_ms_per_token']:.1f} | "
                         f"{s['tp2_step_broadcast_ms_per_step']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="offload,tp")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--gen-len", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="offload section's threads")
    parser.add_argument("--allreduce-rank1", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tables", action="store_true",
                        help="print the README tables from results.json and exit")
    args = parser.parse_args()
    if args.tables:
        print(tables(json.loads((HERE / "results.json").read_text())))
        return
    if args.allreduce_rank1:
        allreduce_worker(args.allreduce_rank1)
        return
    WORK.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for section in args.sections.split(","):
        machine = {"cpu": lscpu_model(), "logical_cores": os.cpu_count(),
                   "torch": torch.__version__, "load_average_at_start": os.getloadavg()}
        results[section] = {"offload": offload, "tp": tp}[section](args)
        machine["load_average_at_end"] = os.getloadavg()
        results[section] = {"command": " ".join(sys.argv), "machine": machine,
                            **results[section]}
        print(json.dumps(results[section]["summary"], indent=1), flush=True)
    out = HERE / "results.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps({**previous, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
