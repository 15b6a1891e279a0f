"""Throughput and latency of the engine at several concurrency levels.

Each level submits ``concurrency`` requests at once and runs them to completion through
continuous batching. Reported: aggregate and per-request output tokens/s, time to first
token and time per output token (p50/p99), and KV-cache usage sampled after every step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass

import numpy as np
import torch

from turboinfer.llm.backends.cpu.kernels import read_bytes_per_token
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.memory_plan import kv_block_bytes
from turboinfer.llm.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class BenchSettings:
    concurrency: tuple[int, ...] = (1, 4, 16)
    prompt_len: int = 64
    gen_len: int = 64
    # Mixed lengths draw each request's prompt and generation length from [len/4, len].
    mixed: bool = False
    seed: int = 0


@dataclass(frozen=True)
class BenchRow:
    concurrency: int
    output_tokens: int
    seconds: float
    tokens_per_s: float
    # Output tokens per second of this process's CPU time: on a shared machine the wall
    # clock measures the neighbours too, CPU time mostly does not.
    tokens_per_cpu_s: float
    tokens_per_s_per_request: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    peak_blocks: int
    total_blocks: int
    kv_slots_unused_pct: float         # allocated paged slots not holding a token
    static_slots_unused_pct: float     # same against a max-length buffer per request
    acceptance_rate: float
    tokens_per_target_forward: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _requests(settings: BenchSettings, n: int, vocab: int) -> list[tuple[list[int], int]]:
    rng = random.Random(settings.seed + n)
    out = []
    for _ in range(n):
        p, g = settings.prompt_len, settings.gen_len
        if settings.mixed:
            p, g = rng.randint(max(1, p // 4), p), rng.randint(max(1, g // 4), g)
        out.append(([rng.randrange(1, vocab) for _ in range(p)], g))
    return out


def _pct(values: Seq[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else 0.0


def bench_level(engine: LLMEngine, settings: BenchSettings, concurrency: int) -> BenchRow:
    vocab = engine.model.config.vocab_size
    reqs = _requests(settings, concurrency, vocab)
    stats = engine.spec_stats
    drafted0, accepted0, emitted0, fwd0 = (stats.drafted, stats.accepted, stats.emitted,
                                           stats.target_forwards)
    begin, cpu_begin = time.perf_counter(), time.process_time()
    seqs = [engine.add_request(p, SamplingParams(max_tokens=g, temperature=0, ignore_eos=True))
            for p, g in reqs]
    peak, tokens_held, slots_alloc, static_slots = 0, 0, 0, 0
    max_len = settings.prompt_len + settings.gen_len
    bs = engine.config.block_size
    while engine.has_unfinished():
        engine.step()
        running = [s for s in engine.scheduler.running if not s.in_prefill]
        if running and len(running) == len(engine.scheduler.running):
            # Steady state: every running request is decoding.
            tokens_held += sum(s.num_tokens for s in running)
            slots_alloc += sum(len(s.block_table) for s in running) * bs
            static_slots += len(running) * max_len
        peak = max(peak, engine.block_manager.num_used_blocks)
    seconds = time.perf_counter() - begin
    cpu_seconds = time.process_time() - cpu_begin
    out_tokens = sum(s.num_output_tokens for s in seqs)
    per_request = [s.num_output_tokens / ((s.token_times[-1] - s.arrival) or 1e-9)
                   for s in seqs]
    ttft = [(s.first_token_time or s.arrival) - s.arrival for s in seqs]
    tpot = [(s.token_times[-1] - s.token_times[0]) / (len(s.token_times) - 1)
            for s in seqs if len(s.token_times) > 1]
    drafted = stats.drafted - drafted0
    forwards = stats.target_forwards - fwd0
    return BenchRow(
        concurrency=concurrency, output_tokens=out_tokens, seconds=seconds,
        tokens_per_s=out_tokens / seconds, tokens_per_cpu_s=out_tokens / cpu_seconds,
        tokens_per_s_per_request=float(np.mean(per_request)),
        ttft_p50_ms=_pct(ttft, 50), ttft_p99_ms=_pct(ttft, 99),
        tpot_p50_ms=_pct(tpot, 50), tpot_p99_ms=_pct(tpot, 99),
        peak_blocks=peak, total_blocks=engine.block_manager.num_blocks,
        kv_slots_unused_pct=100 * (1 - tokens_held / slots_alloc) if slots_alloc else 0.0,
        static_slots_unused_pct=(100 * (1 - tokens_held / static_slots)
                                 if static_slots else 0.0),
        acceptance_rate=(stats.accepted - accepted0) / drafted if drafted else 0.0,
        tokens_per_target_forward=(stats.emitted - emitted0) / forwards if forwards else 0.0,
    )


def run_bench(engine: LLMEngine, settings: BenchSettings) -> list[BenchRow]:
    # One short untimed request first: the first forward pays one-off allocation costs.
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return [bench_level(engine, settings, c) for c in settings.concurrency]


# -- the memory-bandwidth roofline at batch 1 ---------------------------------------------

BANDWIDTH_BUFFER_MB = 256   # well past any last-level cache here (32 MiB)


def _best_seconds(fn: Callable[[], object], reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_read_bandwidth(threads: int, *, buffer_mb: int = BANDWIDTH_BUFFER_MB,
                           reps: int = 7) -> dict[str, float]:
    """STREAM-like read bandwidth (bytes/s) of a buffer far larger than the caches,
    summed by torch (at ``threads`` intra-op threads) and by numpy (one thread); the
    best repetition of each, and their maximum as ``bandwidth``."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(buffer_mb * 2**20 // 4)
        nbytes = buf.numel() * 4
        torch_sum = nbytes / _best_seconds(buf.sum, reps)
        as_numpy = buf.numpy()
        numpy_sum = nbytes / _best_seconds(as_numpy.sum, reps)
    finally:
        torch.set_num_threads(previous)
    return {"torch_sum": torch_sum, "numpy_sum": numpy_sum,
            "bandwidth": max(torch_sum, numpy_sum)}


DEVICE_BUFFER_MB = 1024   # far past any GPU's L2 (50-60 MB on Hopper)


def _best_cuda_seconds(fn: Callable[[], object], reps: int) -> float:
    """The fastest of ``reps`` runs of ``fn`` on the current CUDA stream, by CUDA events."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return best


def measure_device_bandwidth(device: torch.device, *, buffer_mb: int = DEVICE_BUFFER_MB,
                             reps: int = 10) -> dict[str, float]:
    """Bandwidth (bytes/s) of a CUDA device's memory: a sum over a buffer far past its L2
    (bytes read) and a device-to-device copy (bytes read and written), the best
    repetition of each by CUDA events, and their maximum as ``bandwidth``."""
    with torch.cuda.device(device):
        buf = torch.ones(buffer_mb * 2**20 // 2, dtype=torch.bfloat16, device=device)
        dst = torch.empty_like(buf)
        nbytes = buf.numel() * buf.element_size()
        read = nbytes / _best_cuda_seconds(lambda: buf.sum(dtype=torch.float32), reps)
        copy = 2 * nbytes / _best_cuda_seconds(lambda: dst.copy_(buf), reps)
    return {"sum": read, "copy": copy, "bandwidth": max(read, copy)}


@dataclass(frozen=True)
class Roofline:
    """Batch-1 decode against the memory-bandwidth limit: every weight is read once per
    token, and the keys and values of the context, so tokens/s can be at most bandwidth
    / bytes read per token."""

    threads: int
    bandwidth_gb_s: float                # at ``threads`` (or the device's), the limit used
    bandwidth_1thread_gb_s: float        # on a GPU: the device's
    bytes_per_token: int                 # weights + KV cache at the mean context
    roofline_tokens_per_s: float
    achieved_tokens_per_s: float         # batch-1 decode rate, 1000 / TPOT p50
    fraction: float                      # achieved / roofline
    bandwidth_detail: dict[str, dict[str, float]]
    weight_bytes_per_token: int = 0
    kv_bytes_per_token: int = 0          # at the mean context of the decode measured
    device: str = "cpu"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def roofline(engine: LLMEngine, batch1: BenchRow, *, threads: int | None = None,
             context_tokens: int = 0) -> Roofline:
    """The roofline of ``engine``'s model as loaded (its chosen weight formats), with
    ``batch1`` (a concurrency-1 row) as the achieved decode rate; ``context_tokens``: the
    mean context of its decode steps, whose keys and values each step reads too. On a
    GPU the bandwidth is the device memory's, on a CPU the host's at ``threads``."""
    threads = threads or torch.get_num_threads()
    if engine.device.type == "cuda":
        detail = {"cuda": measure_device_bandwidth(engine.device)}
        bandwidth = one_thread = detail["cuda"]["bandwidth"]
    else:
        detail = {"1": measure_read_bandwidth(1)}
        detail[str(threads)] = (detail["1"] if threads == 1
                                else measure_read_bandwidth(threads))
        bandwidth, one_thread = detail[str(threads)]["bandwidth"], detail["1"]["bandwidth"]
    weights = read_bytes_per_token(engine.model)
    # One cached token of the target model: a block of one.
    kv = kv_block_bytes(engine.model.config, 1, engine.runner.kv_cache.k.dtype) * context_tokens
    nbytes = weights + kv
    limit = bandwidth / nbytes
    achieved = 1000 / batch1.tpot_p50_ms if batch1.tpot_p50_ms else batch1.tokens_per_s
    return Roofline(threads=threads, bandwidth_gb_s=bandwidth / 1e9,
                    bandwidth_1thread_gb_s=one_thread / 1e9,
                    bytes_per_token=nbytes, roofline_tokens_per_s=limit,
                    achieved_tokens_per_s=achieved, fraction=achieved / limit,
                    bandwidth_detail=detail, weight_bytes_per_token=weights,
                    kv_bytes_per_token=kv, device=engine.device.type)
