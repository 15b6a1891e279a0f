"""The engine's step backend: each step on the backend ``select.choose_step`` names.

``ModelRunner`` owns the model's paged KV cache and the backends that write it: the
general packed path (``torch/packed.py``, every step, any device) and, built on first
use, the faster paths for the steps they cover (a lone sequence's, several sequences'
one-token decode). Switching a path off (``lean_decode``, ``native_decode``,
``batch_decode``) leaves its steps to the general path; the tests compare them that way.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from turboinfer.llm.backends import select
from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.cpu.batch_decode import BatchDecoder
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.backends.cpu.native_decode import NativeDecoder
from turboinfer.llm.backends.cuda.graphs import GraphDecoder
from turboinfer.llm.backends.torch.lean_decode import LeanDecoder
from turboinfer.llm.backends.torch.packed import TorchBackend
from turboinfer.llm.model.attention import KVCache
from turboinfer.llm.model.llama import LlamaModel

__all__ = ["ModelRunner"]


class ModelRunner:
    """``backend``: ``auto`` (the fast paths by measurement), ``torch`` (every step on the
    general path) or ``graphs`` (decode steps on CUDA graphs). ``scratch_block``: a cache
    block no sequence owns, which a graphed step's padded rows write (CUDA only)."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache, *, lean_decode: bool = True,
                 native_decode: bool = True, backend: str = "auto",
                 scratch_block: int | None = None, max_batch: int = 64,
                 pick_prefetch: bool = True) -> None:
        self.model = model
        # Whether its native step measures the process's fp32 fetch setting (a draft's
        # runner leaves its target's, as its load leaves the prefetch distances).
        self.pick_prefetch = pick_prefetch
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.num_forwards = 0
        self.backend = backend
        # Every step the others do not take, on the cache's device.
        self.general = TorchBackend(model, kv_cache)
        # On a GPU: decode steps as CUDA graphs where the measurement (or ``graphs``)
        # says so, chosen when the first decode step comes (select.device_decoder).
        self._graphs: GraphDecoder | None = None
        self._device_settled = False
        self.device_choice: select.DecodeChoice | None = None
        self.scratch_block = scratch_block
        self.max_batch = max_batch
        self._on_gpu = kv_cache.k.device.type == "cuda"
        # The CPU's fast paths are the CPU's; ``torch`` keeps every step general.
        cpu_fast = backend != "torch" and kv_cache.k.device.type == "cpu"
        lean_decode, native_decode = lean_decode and cpu_fast, native_decode and cpu_fast
        # A step that decodes one token of one sequence goes through the lean decoder
        # (backends/torch/lean_decode.py): same logits and cache writes, a fraction of
        # the overhead.
        self.lean_decode = lean_decode
        # Where every layer has a native kernel, a lone sequence's step of up to
        # select.NATIVE_ROWS tokens is one C call (backends/cpu/native_decode.py):
        # close to the general path's logits, not bit for bit.
        self.native_decode = native_decode
        self._lean: LeanDecoder | NativeDecoder | None = None
        # A step that decodes one token of each of several sequences runs its small ops
        # on decode.c's native ones (backends/cpu/batch_decode.py): logits close to the
        # general path's.
        self.batch_decode = cpu_fast
        self._batch: BatchDecoder | None = None
        # On the CPU the native kernels of a general step run solo (on the calling thread,
        # their workers asleep): torch's operators between them want both cores.
        self._library = (native_status().library if kv_cache.k.device.type == "cpu"
                         else None)

    @torch.inference_mode()
    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """One forward over all items; returns ``[sum(num_logits), vocab]`` float logits."""
        backend = (select.choose_step(items, self._lone, self._batched,
                                      self._device if self._on_gpu else None)
                   or self.general)
        self.num_forwards += 1
        if self._library is not None:
            self._library.set_solo(backend is self.general)
        return backend.run(items)

    # No inference_mode here (nor on greedy_steps): no tensor op runs on this path once
    # the decoders are built (they are built under it), and entering and leaving it
    # cost a tenth of the call's Python.
    def greedy_rows(self, item: StepItem) -> list[int] | None:
        """The greedy choice after each of ``item``'s tokens (all its rows' logits asked
        for), in one native call where a lone sequence's step runs on the native decoder
        with a native LM head; None elsewhere (then ``run`` and an argmax)."""
        if item.num_logits != len(item.token_ids) or (decoder := self._native(item)) is None:
            return None
        ids = decoder.greedy_rows(item.token_ids, item.start, item.block_table)
        if ids is not None:
            self.num_forwards += 1
        return ids

    def greedy_steps(self, item: StepItem, steps: int) -> list[int] | None:
        """``steps`` greedy decode steps of a lone sequence from ``item`` (its one new
        token) in one native call: what ``steps`` calls of ``greedy_rows`` would return,
        bit for bit (the same one-row kernels, LM head included); None where the step
        does not run on the native decoder with a native one-row LM head."""
        decoder = self._native(item) if len(item.token_ids) == 1 else None
        if decoder is None or not decoder.can_run_steps():
            return None
        ids = decoder.greedy(item.token_ids, item.start, item.block_table, steps)
        self.num_forwards += steps
        return ids

    def _native(self, item: StepItem) -> NativeDecoder | None:
        """The native decoder where a lone sequence's step ``item`` runs on it (its
        kernels then split across the library's threads); None elsewhere."""
        if self._on_gpu:
            return None
        decoder = select.choose_step([item], self._lone, self._batched)
        if not isinstance(decoder, NativeDecoder):
            return None
        if self._library is not None:
            self._library.set_solo(False)
        return decoder

    def prepare(self) -> None:
        """On a GPU, settle now, at load, how decode steps run (graphs captured, the
        fused groups compiled, each timed): otherwise the first request would wait for
        it."""
        if self.kv_cache.k.device.type == "cuda":
            self._device()

    def _device(self) -> GraphDecoder | None:
        """The graphed decoder on a GPU, once settled (measured, or forced)."""
        if not self._device_settled:
            self._device_settled = True
            self._graphs, self.device_choice = select.device_decoder(
                self.model, self.kv_cache, self.general, backend=self.backend,
                scratch_block=self.scratch_block, max_batch=self.max_batch)
        return self._graphs

    def native_decoder(self) -> NativeDecoder | None:
        """The native one-call decoder, where a lone sequence's steps run on it."""
        lean = self._lone()
        return lean if isinstance(lean, NativeDecoder) else None

    def decode_path(self) -> str:
        """How a lone sequence's decode step runs: ``native`` (one call into decode.c),
        ``lean`` (torch operations without the batch machinery) or ``general``; on a GPU
        ``graphs`` or ``graphs_fused`` (CUDA graphs, their elementwise groups fused) or
        ``general``."""
        if self.kv_cache.k.device.type != "cpu":
            if self._device() is None:
                return "general"
            return self.device_choice.chosen if self.device_choice else "graphs"
        lean = self._lone()
        return ("native" if isinstance(lean, NativeDecoder)
                else "lean" if lean is not None else "general")

    def _lone(self) -> LeanDecoder | NativeDecoder | None:
        return self._lean_decoder() if self.lean_decode else None

    def _batched(self) -> BatchDecoder | None:
        return self._batch_decoder() if self.batch_decode else None

    def _lean_decoder(self) -> LeanDecoder | NativeDecoder | None:
        """Built on first use: the layers' kernels are chosen, and a parallel group
        joined, by then. Rebuilt when ``native_decode`` is switched."""
        if self._lean is not None and self.native_decode != isinstance(self._lean,
                                                                      NativeDecoder):
            self._lean = None
        if self._lean is None:
            with torch.inference_mode():
                found = select.lone_decoder(self.model, self.kv_cache,
                                            native=self.native_decode,
                                            pick_prefetch=self.pick_prefetch)
            if found is None:
                self.lean_decode = False
                return None
            self.native_decode = isinstance(found, NativeDecoder)
            self._lean = found
        return self._lean

    def _batch_decoder(self) -> BatchDecoder | None:
        """Built on first use (the kernels are chosen by then); where the library is
        absent or the model is not dense float32, the switch goes off for good."""
        if self._batch is None:
            with torch.inference_mode():
                self._batch = select.batch_decoder(self.model, self.kv_cache)
            if self._batch is None:
                self.batch_decode = False
        return self._batch
