"""What the OpenAI-compatible server costs over the in-process engine.

    python benchmarks/llm_server/run.py [--model 110m|demo] [--rounds 3] [--threads 2]

Starts ``turboinfer llm serve`` on the model, then alternates, round after round:
the in-process engine (``turboinfer.llm.bench.bench_level``: the same random-token
prompts, greedy, ``ignore_eos``) and the server through streaming HTTP (aiohttp, one
connection per request, prompts sent as token ids, ``ignore_eos`` extension) at
concurrency 16 (output tokens/s) and 1 (TTFT, inter-token latency). The medians of the
rounds go to ``results.json``; README.md quotes them. ``110m`` is the random 110M-parameter
Llama of benchmarks/llm (built under /tmp on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import itertools
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import torch

from turboinfer.llm import LLM, EngineConfig, demo_model_dir
from turboinfer.llm.bench import BenchSettings, bench_level

HERE = Path(__file__).resolve().parent
WORK = Path("/tmp/turboinfer-llm-bench")
# `turboinfer llm ...` without loading the other subcommands.
LAUNCH = ("import argparse, sys; from turboinfer.commands import llm; "
          "p = argparse.ArgumentParser(); llm.add_arguments(p); "
          "sys.exit(llm.run(p.parse_args(sys.argv[1:])))")


def model_folder(name: str) -> Path:
    if name == "demo":
        return demo_model_dir()
    spec = importlib.util.spec_from_file_location("llm_bench", HERE.parent / "llm" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(module.build_110m(WORK / "llama-110m"))


def start_server(folder: Path, threads: int) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-c", LAUNCH, "serve", str(folder), "--port", "0",
            "--threads", str(threads), "--kv-cache-tokens", "4096",
            "--served-model-name", "bench"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, "http://" + line.split("http=")[1].split()[0]


async def one_request(session: aiohttp.ClientSession, url: str, prompt: list[int],
                      gen_len: int) -> tuple[float, list[float], int]:
    """(TTFT, gaps between chunks, chunks) of one streamed completion."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": gen_len, "temperature": 0,
            "ignore_eos": True, "stream": True}
    begin = time.perf_counter()
    times: list[float] = []
    async with session.post(f"{url}/v1/completions", json=body) as reply:
        async for line in reply.content:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return times[0] - begin, gaps, len(times)


async def server_level(url: str, prompts: list[list[int]], gen_len: int) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        begin = time.perf_counter()
        results = await asyncio.gather(*(one_request(session, url, p, gen_len)
                                         for p in prompts))
        seconds = time.perf_counter() - begin
    ttft = [r[0] for r in results]
    gaps = [g for r in results for g in r[1]]
    return {"tokens_per_s": len(prompts) * gen_len / seconds,
            "ttft_p50_ms": statistics.median(ttft) * 1000,
            "itl_p50_ms": statistics.median(gaps) * 1000}


async def server_single(url: str, prompts: list[list[int]], gen_len: int) -> dict[str, float]:
    rows = [await server_level(url, [p], gen_len) for p in prompts]
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def engine_level(llm: LLM, concurrency: int, settings: BenchSettings) -> dict[str, float]:
    row = bench_level(llm.engine, settings, concurrency)
    return {"tokens_per_s": row.tokens_per_s, "ttft_p50_ms": row.ttft_p50_ms,
            "itl_p50_ms": row.tpot_p50_ms}


def prompts_like_bench(llm: LLM, settings: BenchSettings, n: int) -> list[list[int]]:
    """``n`` prompts as ``bench_level`` makes them; a fresh ``settings.seed`` gives new ones."""
    from turboinfer.llm.bench import _requests

    return [p for p, _ in _requests(settings, n, llm.model.config.vocab_size)]


def one_round(llm: LLM, url: str, settings: BenchSettings, round_: int
              ) -> dict[str, dict[str, float]]:
    """Every request of every round gets a prompt never seen before, on both sides, so
    the prefix cache never turns a prefill into a lookup and TTFT is a real prefill."""
    gen = settings.gen_len
    fresh = iter(range(1000 * (round_ + 1), 1000 * (round_ + 2), 2))

    def seeded() -> BenchSettings:
        return dataclasses.replace(settings, seed=next(fresh))

    out = {"engine_c16": engine_level(llm, 16, seeded()),
           "server_c16": asyncio.run(server_level(url, prompts_like_bench(llm, seeded(), 16),
                                                  gen))}
    # Concurrency 1: five requests one after another, the median of each measure.
    singles = [engine_level(llm, 1, seeded()) for _ in range(5)]
    out["engine_c1"] = {k: statistics.median(r[k] for r in singles) for k in singles[0]}
    out["server_c1"] = asyncio.run(server_single(url, prompts_like_bench(llm, seeded(), 5),
                                                 gen))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["110m", "demo"], default="110m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    folder = model_folder(args.model)
    torch.set_num_threads(args.threads)
    llm = LLM(folder, config=EngineConfig(kv_cache_tokens=4096, num_threads=args.threads))
    settings = BenchSettings(concurrency=(16,), prompt_len=64, gen_len=64)
    bench_level(llm.engine, BenchSettings(concurrency=(2,), prompt_len=8, gen_len=4), 2)
    proc, url = start_server(folder, args.threads)
    try:
        asyncio.run(server_level(url, prompts_like_bench(llm, settings, 2), 4))  # warm-up
        rounds = [one_round(llm, url, settings, r) for r in range(args.rounds)]
    finally:
        proc.terminate()
        proc.wait()
    medians = {k: {m: statistics.median(r[k][m] for r in rounds) for m in rounds[0][k]}
               for k in rounds[0]}
    result: dict[str, Any] = {
        "model": args.model, "threads": args.threads, "rounds": args.rounds,
        "prompt_len": 64, "gen_len": 64, "cpu": platform.processor() or platform.machine(),
        "medians": medians, "rounds_detail": rounds,
        "server_over_engine_tokens_per_s_c16": medians["server_c16"]["tokens_per_s"]
        / medians["engine_c16"]["tokens_per_s"],
        "ttft_c1_server_minus_engine_ms": medians["server_c1"]["ttft_p50_ms"]
        - medians["engine_c1"]["ttft_p50_ms"],
        "itl_c1_server_minus_engine_ms": medians["server_c1"]["itl_p50_ms"]
        - medians["engine_c1"]["itl_p50_ms"],
    }
    out = HERE / f"results_{args.model}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds_detail"}, indent=2))


if __name__ == "__main__":
    main()
