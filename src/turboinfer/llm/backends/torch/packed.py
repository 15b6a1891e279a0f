"""The general step: every item's tokens packed into one forward of the model's modules.

It runs any step (prompt chunks, decode tokens, speculative verification, all mixed) on
any ``torch.device``: the step's token ids, positions, slots and mask are built on the
device of the KV cache, and the model's modules (with whatever linear kernels were
chosen for them at load) do the rest. It is the reference the faster paths are checked
against, and what runs every step those paths do not cover.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.model.attention import AttentionBatch, KVCache
from turboinfer.llm.model.llama import LlamaModel


class TorchBackend:
    """Packed forward passes of ``model`` over ``kv_cache`` on ``device`` (default: the
    cache's; the model's weights and the cache must live there)."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache,
                 device: torch.device | None = None) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        where = kv_cache.k.device
        self.device = where if device is None else torch.device(device)
        if self.device.type != where.type or self.device.index not in (None, where.index):
            raise ValueError(f"the KV cache is on {where}, not on {self.device}")

    @torch.inference_mode()
    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """One forward over all items; returns ``[sum(num_logits), vocab]`` float logits."""
        lens = [len(it.token_ids) for it in items]
        batch = AttentionBatch.build(
            starts=[it.start for it in items], query_lens=lens,
            block_tables=[it.block_table for it in items], block_size=self.block_size,
            device=self.device,
        )
        input_ids = torch.tensor([t for it in items for t in it.token_ids], dtype=torch.long,
                                 device=self.device)
        hidden = self.model(input_ids, batch.positions, batch, self.kv_cache)   # [T, hidden]
        if all(it.num_logits == 1 for it in items) and max(lens) == 1:
            return self.model.logits(hidden)
        index: list[int] = []
        end = 0
        for it, n in zip(items, lens, strict=True):
            end += n
            index.extend(range(end - it.num_logits, end))
        if not index:
            return hidden.new_zeros(0, self.model.config.vocab_size)
        return self.model.logits(hidden[torch.tensor(index, dtype=torch.long,
                                                     device=self.device)])
