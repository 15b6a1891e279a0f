"""Turns scheduled sequences into one packed forward pass and returns the logits."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from turboinfer.llm.attention import AttentionBatch, KVCache
from turboinfer.llm.lean_decode import LeanDecoder, supports_lean
from turboinfer.llm.model import LlamaModel


@dataclass(frozen=True)
class StepItem:
    """Feed ``token_ids`` at positions ``start...``; return the last ``num_logits`` logits."""

    token_ids: list[int]
    start: int
    block_table: list[int]
    num_logits: int


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache, *, lean_decode: bool = True,
                 ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.num_forwards = 0
        # A step that decodes one token of one sequence goes through the lean decoder
        # (llm/lean_decode.py): same logits and cache writes, a fraction of the overhead.
        self.lean_decode = lean_decode
        self._lean: LeanDecoder | None = None

    @torch.inference_mode()
    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """One forward over all items; returns ``[sum(num_logits), vocab]`` float logits."""
        if (self.lean_decode and len(items) == 1 and len(items[0].token_ids) == 1
                and items[0].num_logits == 1 and self._lean_decoder() is not None):
            assert self._lean is not None
            it = items[0]
            self.num_forwards += 1
            return self._lean.step(it.token_ids[0], it.start, it.block_table)
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

    def _lean_decoder(self) -> LeanDecoder | None:
        """Built on first use: the layers' kernels are chosen, and a parallel group
        joined, by then."""
        if self._lean is None:
            if not supports_lean(self.model):
                self.lean_decode = False
                return None
            self._lean = LeanDecoder(self.model, self.kv_cache)
        return self._lean
