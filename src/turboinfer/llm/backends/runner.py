"""Turns scheduled sequences into one packed forward pass and returns the logits."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from turboinfer.llm.backends.cpu.batch_decode import BatchDecoder, supports_batch_decode
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.backends.cpu.native_decode import NativeDecoder
from turboinfer.llm.backends.torch.lean_decode import LeanDecoder, supports_lean
from turboinfer.llm.model.attention import AttentionBatch, KVCache
from turboinfer.llm.model.llama import LlamaModel


@dataclass(frozen=True)
class StepItem:
    """Feed ``token_ids`` at positions ``start...``; return the last ``num_logits`` logits."""

    token_ids: list[int]
    start: int
    block_table: list[int]
    num_logits: int


# A lone sequence's step of at most this many new tokens (a decode step, a speculative
# verification) goes through the native one-call step; longer ones (prompts) take the
# packed path, whose prompt-chunk kernels and causal SDPA are faster there.
NATIVE_ROWS = 16


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache, *, lean_decode: bool = True,
                 native_decode: bool = True) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.num_forwards = 0
        # A step that decodes one token of one sequence goes through the lean decoder
        # (backends/torch/lean_decode.py): same logits and cache writes, a fraction of the overhead.
        self.lean_decode = lean_decode
        # Where every layer has a native kernel, a lone sequence's step of up to
        # NATIVE_ROWS tokens is one C call (llm/backends/cpu/native_decode.py): close to the general
        # path's logits, not bit for bit.
        self.native_decode = native_decode
        self._lean: LeanDecoder | NativeDecoder | None = None
        # A step that decodes one token of each of several sequences runs its small ops
        # on decode.c's native ones (llm/backends/cpu/batch_decode.py): logits close to this path's.
        self.batch_decode = True
        self._batch: BatchDecoder | None = None

    @torch.inference_mode()
    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """One forward over all items; returns ``[sum(num_logits), vocab]`` float logits."""
        if self.lean_decode and len(items) == 1 and self._lean_decoder() is not None:
            it, lean = items[0], self._lean
            if isinstance(lean, NativeDecoder) and len(it.token_ids) <= NATIVE_ROWS:
                self.num_forwards += 1
                return lean.forward(it.token_ids, it.start, it.block_table, it.num_logits)
            if isinstance(lean, LeanDecoder) and len(it.token_ids) == 1 and it.num_logits == 1:
                self.num_forwards += 1
                return lean.step(it.token_ids[0], it.start, it.block_table)
        if (self.batch_decode and len(items) > 1
                and all(len(it.token_ids) == 1 and it.num_logits == 1 for it in items)
                and self._batch_decoder() is not None):
            assert self._batch is not None
            self.num_forwards += 1
            return self._batch.step([it.token_ids[0] for it in items],
                                    [it.start for it in items], [it.block_table for it in items])
        lens = [len(it.token_ids) for it in items]
        batch = AttentionBatch.build(
            starts=[it.start for it in items], query_lens=lens,
            block_tables=[it.block_table for it in items], block_size=self.block_size,
        )
        input_ids = torch.tensor([t for it in items for t in it.token_ids], dtype=torch.long)
        hidden = self.model(input_ids, batch.positions, batch, self.kv_cache)   # [T, hidden]
        self.num_forwards += 1
        if all(it.num_logits == 1 for it in items) and max(lens) == 1:
            return self.model.logits(hidden)
        index: list[int] = []
        end = 0
        for it, n in zip(items, lens, strict=True):
            end += n
            index.extend(range(end - it.num_logits, end))
        if not index:
            return hidden.new_zeros(0, self.model.config.vocab_size)
        return self.model.logits(hidden[torch.tensor(index, dtype=torch.long)])

    def native_decoder(self) -> NativeDecoder | None:
        """The native one-call decoder, where a lone sequence's steps run on it."""
        lean = self._lean_decoder() if self.lean_decode else None
        return lean if isinstance(lean, NativeDecoder) else None

    def decode_path(self) -> str:
        """How a lone sequence's decode step runs: ``native`` (one call into decode.c),
        ``lean`` (torch operations without the batch machinery) or ``general``."""
        lean = self._lean_decoder() if self.lean_decode else None
        return ("native" if isinstance(lean, NativeDecoder)
                else "lean" if lean is not None else "general")

    def _lean_decoder(self) -> LeanDecoder | NativeDecoder | None:
        """Built on first use: the layers' kernels are chosen, and a parallel group
        joined, by then. Rebuilt when ``native_decode`` is switched."""
        if self._lean is not None and self.native_decode != isinstance(self._lean,
                                                                      NativeDecoder):
            self._lean = None
        if self._lean is None:
            if not supports_lean(self.model):
                self.lean_decode = False
                return None
            native = NativeDecoder.build(self.model, self.kv_cache) if self.native_decode else None
            self.native_decode = native is not None
            self._lean = native or LeanDecoder(self.model, self.kv_cache)
        return self._lean

    def _batch_decoder(self) -> BatchDecoder | None:
        """Built on first use (the kernels are chosen by then); where the library is
        absent or the model is not dense float32, the switch goes off for good."""
        if self._batch is None:
            library = native_status().library
            if library is None or not supports_batch_decode(self.model, self.kv_cache):
                self.batch_decode = False
                return None
            self._batch = BatchDecoder(self.model, self.kv_cache, library)
        return self._batch
