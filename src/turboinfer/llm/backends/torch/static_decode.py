"""A decode step of fixed shape: what a CUDA graph can capture, run eagerly anywhere.

A graph replays the kernels it recorded on the buffers it recorded them with, so every
input of the step lives in a static buffer of fixed shape: ``batch`` sequences (padded
rows decode into a scratch block of the cache) and ``blocks`` blocks of keys per
sequence (a block table padded with the scratch block; the mask, computed inside the
step from the positions, hides what lies past each sequence's token). Attention is SDPA
over the keys gathered through the block table, as on the general path. The same
object runs eagerly on the CPU, where the tests check it against the general path; the
capture itself is ``backends/cuda/graphs.py``.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.model.attention import AttentionBatch, KVCache
from turboinfer.llm.model.llama import EAGER_OPS, LlamaModel, StepOps


class StaticDecodeStep:
    """One token for each of up to ``batch`` sequences of at most ``blocks`` blocks.

    ``scratch_block``: a cache block no sequence owns, where padded rows write; ``ops``:
    the layers' elementwise groups (eager, or fused by ``fused.py``)."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache, *, batch: int, blocks: int,
                 scratch_block: int, ops: StepOps = EAGER_OPS) -> None:
        self.model = model
        self.ops = ops
        self.kv_cache = kv_cache
        self.batch = batch
        self.blocks = blocks
        self.block_size = kv_cache.block_size
        self.scratch_block = scratch_block
        device = kv_cache.k.device
        # One buffer for every input, so a step's inputs reach the device in one copy:
        # [ids | positions | slots | block tables].
        self.inputs = torch.zeros(3 * batch + batch * blocks, dtype=torch.long, device=device)
        self.ids, self.positions, self.slots, flat_tables = self.inputs.split(
            [batch, batch, batch, batch * blocks])
        self.tables = flat_tables.view(batch, blocks)
        self.key_pos = torch.arange(blocks * self.block_size, device=device)
        # Pinned on a GPU: the copy to the device then runs asynchronously.
        self.host = torch.zeros(self.inputs.shape, dtype=torch.long,
                                pin_memory=device.type == "cuda")
        self.stage([])   # every row padding until the first step

    def fits(self, items: Seq[StepItem]) -> bool:
        return (len(items) <= self.batch
                and all(len(it.block_table) <= self.blocks for it in items))

    def stage(self, items: Seq[StepItem]) -> None:
        """Write the step's inputs into the host buffer and copy them to the device."""
        b, m, bs = self.batch, self.blocks, self.block_size
        n = len(items)
        scratch = self.scratch_block
        values: list[int] = [it.token_ids[0] for it in items] + [0] * (b - n)
        values += [it.start for it in items] + [0] * (b - n)
        values += [it.block_table[it.start // bs] * bs + it.start % bs for it in items]
        values += [scratch * bs] * (b - n)
        for it in items:
            values += it.block_table
            values += [scratch] * (m - len(it.block_table))
        values += [scratch] * (m * (b - n))
        # One host tensor from the list, then one (asynchronous where pinned) copy.
        self.host.copy_(torch.tensor(values, dtype=torch.long))
        self.inputs.copy_(self.host, non_blocking=True)

    def forward(self) -> torch.Tensor:
        """The step on the static buffers: ``[batch, vocab]`` float logits."""
        allowed = self.key_pos[None, :] <= self.positions[:, None]              # [B, L]
        mask = torch.zeros(allowed.shape, dtype=self.kv_cache.k.dtype,
                           device=allowed.device).masked_fill_(~allowed, float("-inf"))
        batch = AttentionBatch(
            positions=self.positions, slot_mapping=self.slots,
            seq_index=torch.arange(self.batch, device=allowed.device),
            query_offset=torch.zeros_like(self.positions), block_tables=self.tables,
            mask=mask[:, None, None, :], max_query_len=1,
            query_lens=(1,) * self.batch)
        hidden = self.model(self.ids, self.positions, batch, self.kv_cache, self.ops)
        return self.model.logits(hidden)

    @torch.inference_mode()
    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """Eagerly: ``[len(items), vocab]`` logits."""
        self.stage(items)
        return self.forward()[:len(items)]
