"""Which backend runs a step: the one place that decides.

Two decisions, both resting on measurement:

* At load (``measure``): the thread count and, for every linear shape of the model,
  the kernel measured fastest at the row counts the engine runs (``cpu/threads.py``,
  ``cpu/kernels.py``), then how far ahead the native kernels prefetch their weights,
  timed on the model's own one-row products (``cpu/prefetch.py``). A native C kernel is
  kept at one row when it is within ``NATIVE_STEP_MARGIN`` of the fastest, because a lone
  sequence's step runs as one call into C only where every layer has one.
* At every step (``choose_step``): a lone sequence's step of at most ``NATIVE_ROWS``
  new tokens goes to the native one-call step (``cpu/native_decode.py``) where every
  layer's chosen kernel is native, else a one-token step to the lean torch decoder
  (``torch/lean_decode.py``); a step of one new token for each of several sequences to
  the batched native step (``cpu/batch_decode.py``); anything else (prompts, mixed
  steps, several sequences' verifications) to the general packed path
  (``torch/packed.py``), which runs on any ``torch.device``.

Which of the fast paths exist is fixed when the runner first needs them
(``lone_decoder``, ``batch_decoder``): the CPU paths need the model in CPU memory, dense
layers in one process and, for the native ones, the C library and float32 weights.

On a GPU (``device_decoder``): decode steps (one new token for each of up to
``max_num_seqs`` sequences) replay CUDA graphs (``cuda/graphs.py``) where a batch-1 step
measured faster there than on the general path (CUDA events, after warm-up), or where the
backend ``graphs`` was asked for; every other step takes the general path. The graphs
capture the layers' elementwise groups eager or fused by torch.compile
(``torch/fused.py``), whichever measured faster.
The measurement is kept (``DecodeChoice``, in ``llm bench --json``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass, field

import torch

from turboinfer.llm.backends.base import StepBackend, StepItem
from turboinfer.llm.backends.cpu.batch_decode import BatchDecoder, supports_batch_decode
from turboinfer.llm.backends.cpu.kernels import NATIVE_STEP_MARGIN, KernelChoice, select_kernels
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.backends.cpu.native_decode import NativeDecoder
from turboinfer.llm.backends.cpu.prefetch import PrefetchChoice, choose_prefetch
from turboinfer.llm.backends.cpu.threads import ThreadChoice, choose_threads
from turboinfer.llm.backends.cuda.graphs import GraphDecoder
from turboinfer.llm.backends.torch.fused import fused_ops
from turboinfer.llm.backends.torch.lean_decode import LeanDecoder, supports_lean
from turboinfer.llm.model.attention import KVCache
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.llama import LlamaModel

__all__ = [
    "NATIVE_ROWS",
    "NATIVE_STEP_MARGIN",
    "DecodeChoice",
    "Measured",
    "batch_decoder",
    "choose_step",
    "device_decoder",
    "lone_decoder",
    "measure",
]

# A lone sequence's step of at most this many new tokens (a decode step, a speculative
# verification) goes through the native one-call step; longer ones (prompts) take the
# packed path, whose prompt-chunk kernels and causal SDPA are faster there.
NATIVE_ROWS = 16

LoneDecoder = LeanDecoder | NativeDecoder


@dataclass(frozen=True)
class Measured:
    """What ``measure`` decided for one model."""

    threads: ThreadChoice | None      # None: the count already set stays
    kernels: list[KernelChoice]
    prefetch: PrefetchChoice | None   # None: not measured (no native kernel, not asked)


def measure(model: LlamaModel, quant: QuantMode, *, group_size: int,
            pick_threads: bool, pick_prefetch: bool = True) -> Measured:
    """At load, on this machine: the thread count measured fastest on the model's widest
    projection (``pick_threads``; else the count already set stays), then every linear
    layer's kernels measured at that count, swapped into the model, then (``pick_prefetch``)
    the native kernels' prefetch distance on those kernels. The distance is one setting
    of the process: a draft model's load leaves its target's."""
    threads = None
    if pick_threads:
        c = model.config
        threads = choose_threads(c.hidden_size, 2 * c.intermediate_size)
    # The native kernels split across as many threads as torch runs with, before they
    # are timed against torch's.
    library = native_status().library
    if library is not None:
        library.set_threads(torch.get_num_threads())
    kernels = select_kernels(model, quant, group_size=group_size)
    prefetch = (choose_prefetch(model, library) if library is not None and pick_prefetch
                else None)
    return Measured(threads, kernels, prefetch)


def _on_cpu(kv_cache: KVCache) -> bool:
    return kv_cache.k.device.type == "cpu"


def lone_decoder(model: LlamaModel, kv_cache: KVCache, *, native: bool,
                 pick_prefetch: bool = True) -> LoneDecoder | None:
    """What a lone sequence's steps run on: the native one-call step where ``native`` and
    every layer has a native kernel, else the lean torch decoder; None where neither
    applies (the general path then). Build it after the kernels are chosen and a
    parallel group joined: both decide what it can do."""
    if not _on_cpu(kv_cache) or not supports_lean(model):
        return None
    found = (NativeDecoder.build(model, kv_cache, pick_prefetch=pick_prefetch) if native
             else None)
    return found or LeanDecoder(model, kv_cache)


def batch_decoder(model: LlamaModel, kv_cache: KVCache) -> BatchDecoder | None:
    """The batched native decode step, where the C library loaded and the model is dense
    float32 in CPU memory; else None (the general path)."""
    library = native_status().library
    if library is None or not _on_cpu(kv_cache) or not supports_batch_decode(model, kv_cache):
        return None
    return BatchDecoder(model, kv_cache, library)


def choose_step(items: Seq[StepItem], lone: Callable[[], LoneDecoder | None],
                batch: Callable[[], BatchDecoder | None],
                device: Callable[[], GraphDecoder | None] | None = None,
                ) -> StepBackend | None:
    """The backend that runs this step, None for the general path. ``lone`` and ``batch``
    hand over the runner's CPU decoders, ``device`` its GPU one (built on first use, None
    where switched off or unsupported); each is asked only for a step it could take."""
    if device is not None and all(len(it.token_ids) == 1 and it.num_logits == 1
                                  for it in items):
        graphs = device()
        if graphs is not None and graphs.fits(items):
            return graphs
    if len(items) == 1:
        decoder = lone()
        if decoder is not None:
            item = items[0]
            if isinstance(decoder, NativeDecoder):
                if len(item.token_ids) <= NATIVE_ROWS:
                    return decoder
            elif len(item.token_ids) == 1 and item.num_logits == 1:
                return decoder
    if len(items) > 1 and all(len(it.token_ids) == 1 and it.num_logits == 1 for it in items):
        return batch()
    return None


@dataclass(frozen=True)
class DecodeChoice:
    """How a GPU's decode steps run, and the batch-1 step times that decided it."""

    chosen: str                       # "graphs", "graphs_fused" or "general"
    forced: bool                      # graphs or the general path asked for (backend)
    step_ms: dict[str, float]         # median batch-1 step per candidate, when measured
    # Candidates that could not run here, and why (fused graphs where torch.compile fails).
    unavailable: dict[str, str] = field(default_factory=dict)
    # Seconds of each candidate's first two steps: a graph's capture, torch.compile's work.
    prepare_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


DECODE_TRIALS = 20


def _time_step_ms(backend: StepBackend, items: list[StepItem]) -> tuple[float, float]:
    """Median of ``DECODE_TRIALS`` steps timed with CUDA events, after two untimed, and
    the seconds those two took (a graph's capture, a compilation)."""
    begin = time.perf_counter()
    for _ in range(2):
        backend.run(items)
    torch.cuda.synchronize()
    prepare_s = time.perf_counter() - begin
    times = []
    for _ in range(DECODE_TRIALS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        backend.run(items)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), prepare_s


def device_decoder(model: LlamaModel, kv_cache: KVCache, general: StepBackend, *,
                   backend: str, scratch_block: int | None, max_batch: int,
                   ) -> tuple[GraphDecoder | None, DecodeChoice | None]:
    """The graphed decoder for a model on a CUDA device where it measured faster (or was
    asked for), else None: its layers' elementwise groups eager or fused by
    torch.compile, whichever measured faster. The measurement decodes into the scratch
    block only."""
    if backend == "torch":
        return None, DecodeChoice("general", True, {})
    # Mixture-of-experts routing and a sharded model's collectives are not capturable.
    if kv_cache.k.device.type != "cuda" or scratch_block is None or not supports_lean(model):
        return None, None
    candidates: dict[str, StepBackend] = {
        "graphs": GraphDecoder(model, kv_cache, max_batch=max_batch,
                               scratch_block=scratch_block),
        "graphs_fused": GraphDecoder(model, kv_cache, max_batch=max_batch,
                                     scratch_block=scratch_block, ops=fused_ops())}
    if backend != "graphs":
        candidates["general"] = general
    probe = [StepItem([0], 0, [scratch_block], 1)]
    times: dict[str, float] = {}
    unavailable: dict[str, str] = {}
    prepare_s: dict[str, float] = {}
    for name, candidate in candidates.items():
        try:
            times[name], prepare_s[name] = _time_step_ms(candidate, probe)
        except Exception as exc:  # inductor's and Triton's failures have no common base
            if name != "graphs_fused":
                raise
            unavailable[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    chosen = min(times, key=lambda k: times[k])
    picked = candidates[chosen]
    graphs = picked if isinstance(picked, GraphDecoder) else None
    return graphs, DecodeChoice(chosen, backend == "graphs", times, unavailable, prepare_s)
