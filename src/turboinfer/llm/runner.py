"""Turns scheduled sequences into one packed forward pass and returns the logits."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from turboinfer.llm.attention import AttentionBatch, KVCache
from turboinfer.llm.model import LlamaModel


@dataclass(frozen=True)
class StepItem:
    """Feed ``token_ids`` at positions ``start...``; return the last ``num_logits`` logits."""

    token_ids: list[int]
    start: int
    block_table: list[int]
    num_logits: int


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.num_forwards = 0

    @torch.inference_mode()
    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """One forward over all items; returns ``[sum(num_logits), vocab]`` float logits."""
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
