"""Attention over a paged KV cache, and the per-step batch metadata it needs.

The linear layers run on all of a step's tokens packed into one ``[T, ...]`` tensor
(no padding, so no wasted matmul work). Attention needs per-sequence structure, so
queries are scattered into ``[B, Qmax, ...]``, keys/values are gathered from the cache
through the block tables into ``[B, L, ...]``, and one masked SDPA call covers the whole
batch. A decode-only step (every query length 1) skips the scatter entirely, and a step
of fresh prompts (nothing cached before them) skips the cache read: each prompt attends
to its own keys and values with causal SDPA, which also skips the masked-out half of the
score blocks that an explicit mask makes it compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class KVCache:
    """One preallocated cache for all layers: ``[layers, blocks, block_size, kv_heads, D]``."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def allocate(cls, *, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | None = None) -> KVCache:
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        # Zeros, not empty: padded query rows read unused slots and must stay finite.
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device))

    @property
    def block_size(self) -> int:
        return int(self.k.shape[2])

    @property
    def num_blocks(self) -> int:
        return int(self.k.shape[1])


@dataclass
class AttentionBatch:
    """Where each packed token sits: its sequence, its slot, and what it may attend to."""

    positions: torch.Tensor      # [T] absolute position of each token
    slot_mapping: torch.Tensor   # [T] flat cache slot each token's K/V is written to
    seq_index: torch.Tensor      # [T] which sequence (row of block_tables) a token is in
    query_offset: torch.Tensor   # [T] index of the token within its sequence's chunk
    block_tables: torch.Tensor   # [B, max_blocks]
    # [B, 1, Qmax, L] float: 0 where attention is allowed, -inf elsewhere. Additive and
    # built once per step: SDPA would otherwise turn a bool mask into this in every layer.
    # None for a fresh step, which needs no mask.
    mask: torch.Tensor | None
    max_query_len: int
    query_lens: tuple[int, ...] = ()
    # Every sequence starts at position 0: its keys are exactly this step's own.
    fresh: bool = False
    # One sequence decoding one token whose blocks up to it are consecutive: its keys are
    # the flat cache slots [first, first + count), a view, so no gather and no mask.
    span: tuple[int, int] | None = None

    @classmethod
    def build(cls, *, starts: list[int], query_lens: list[int], block_tables: list[list[int]],
              block_size: int, device: torch.device | None = None) -> AttentionBatch:
        """``starts[b]``: tokens of sequence b already cached; ``query_lens[b]``: new ones.
        The tensors are built on ``device`` (default: the CPU), where the cache lives."""
        num_seqs = len(starts)
        max_blocks = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in block_tables],
                              dtype=torch.long, device=device)
        key_pos = torch.arange(max_blocks * block_size, device=device)
        max_q = max(query_lens)
        if max_q == 1:
            # Decode step: one token per sequence. Plain Python is cheaper than a dozen
            # tiny tensor ops here, and this runs once per step (and per draft step).
            slots = [t[p // block_size] * block_size + p % block_size
                     for t, p in zip(block_tables, starts, strict=True)]
            start = torch.tensor(starts, dtype=torch.long, device=device)
            span = _span(block_tables[0], starts[0], block_size) if num_seqs == 1 else None
            allowed = (key_pos[None, :] <= start[:, None])[:, None, None, :]      # [B,1,1,L]
            return cls(start, torch.tensor(slots, dtype=torch.long, device=device),
                       torch.arange(num_seqs, device=device),
                       torch.zeros(num_seqs, dtype=torch.long, device=device), tables,
                       None if span else _additive(allowed), 1, tuple(query_lens), span=span)
        start = torch.tensor(starts, dtype=torch.long, device=device)
        qlens = torch.tensor(query_lens, dtype=torch.long, device=device)
        fresh = not any(starts)
        seq_index = torch.repeat_interleave(torch.arange(num_seqs, device=device),
                                            qlens)                                    # [T]
        first = torch.cumsum(qlens, 0) - qlens
        query_offset = torch.arange(sum(query_lens), device=device) - first[seq_index]
        positions = start[seq_index] + query_offset
        slots_t = (tables[seq_index, positions // block_size] * block_size
                   + positions % block_size)
        if fresh:
            return cls(positions, slots_t, seq_index, query_offset, tables, None, max_q,
                       tuple(query_lens), fresh=True)
        query_pos = start[:, None] + torch.arange(max_q, device=device)[None, :]  # [B, Qmax]
        allowed = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)  # [B,1,Q,L]
        return cls(positions, slots_t, seq_index, query_offset, tables, _additive(allowed),
                   max_q, tuple(query_lens))


def _span(table: list[int], position: int, block_size: int) -> tuple[int, int] | None:
    """(first flat slot, position + 1) when the blocks holding positions 0..position are
    consecutive in the cache, as a lone sequence's blocks usually are."""
    used = table[:position // block_size + 1]
    if used[-1] - used[0] != len(used) - 1 or used != list(range(used[0], used[-1] + 1)):
        return None
    return used[0] * block_size, position + 1


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed,
                                                                          float("-inf"))


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    batch: AttentionBatch, scale: float) -> torch.Tensor:
    """Write this step's K/V into the cache, then attend over each sequence's blocks.

    q: [T, H, D]; k, v: [T, KVH, D]; k_cache, v_cache: [blocks, block_size, KVH, D].
    Returns [T, H, D].
    """
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    flat_k.index_copy_(0, batch.slot_mapping, k)
    flat_v.index_copy_(0, batch.slot_mapping, v)
    if batch.fresh:
        return fresh_attention(q, k, v, batch.query_lens, scale=scale)
    if batch.span is not None:
        first, count = batch.span
        out = F.scaled_dot_product_attention(
            q.view(1, 1, *q.shape[1:]).transpose(1, 2),
            flat_k[first:first + count].unsqueeze(0).transpose(1, 2),
            flat_v[first:first + count].unsqueeze(0).transpose(1, 2),
            scale=scale, enable_gqa=num_kv_heads != q.shape[1])
        return out.reshape(q.shape)

    assert batch.mask is not None
    mask = batch.mask if batch.mask.dtype == q.dtype else batch.mask.to(q.dtype)
    num_seqs = batch.block_tables.shape[0]
    # index_select copies whole blocks (contiguous runs); 2-D advanced indexing gathers
    # element by element and took several times the CPU for the same gather.
    flat_table = batch.block_tables.view(-1)
    keys = k_cache.index_select(0, flat_table).view(num_seqs, -1, num_kv_heads, head_dim)
    values = v_cache.index_select(0, flat_table).view(num_seqs, -1, num_kv_heads, head_dim)
    if batch.max_query_len == 1 and q.shape[1] != num_kv_heads and q.is_cuda:
        # On a GPU, SDPA under a mask runs memory-efficient attention, which some torch
        # releases refuse for grouped heads (their fallback, the math kernel, copies
        # every key once per query head). The CPU's kernel takes both as they are.
        return grouped_decode_attention(q, keys, values, mask, scale=scale)
    # One sequence (single-stream speculative verification) or one token per sequence
    # (decode): the packed tokens already have the [B, Qmax] layout, no scatter needed.
    no_scatter = batch.max_query_len == 1 or num_seqs == 1
    if no_scatter:
        queries = q.view(num_seqs, -1, *q.shape[1:])                # [B, Qmax, H, D]
    else:
        queries = q.new_zeros(num_seqs, batch.max_query_len, *q.shape[1:])
        queries[batch.seq_index, batch.query_offset] = q            # [B, Qmax, H, D]
    out = F.scaled_dot_product_attention(
        queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
        attn_mask=mask, scale=scale, enable_gqa=num_kv_heads != q.shape[1],
    ).transpose(1, 2)                                               # [B, Qmax, H, D]
    if no_scatter:
        return out.reshape(q.shape)
    return out[batch.seq_index, batch.query_offset]


def grouped_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             mask: torch.Tensor, *, scale: float) -> torch.Tensor:
    """One query token per sequence over grouped key/value heads, without expanding them:
    each key/value head's query heads become its query rows. q: [B, H, D]; keys, values:
    [B, L, KVH, D]; mask: additive, [B, 1, 1, L]. Returns [B, H, D]."""
    num_seqs, heads, head_dim = q.shape
    num_kv_heads = keys.shape[2]
    # Head h reads key/value head h // (H / KVH): the view puts it at [h // G, h % G].
    rows = q.view(num_seqs, num_kv_heads, heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(rows, keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=mask, scale=scale)
    return out.reshape(q.shape)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    scale: float) -> torch.Tensor:
    """Causal attention of one sequence without a cache. q: [T, H, D]; k, v: [T, KVH, D].

    Batched as [1, heads, T, D]: with 3-D inputs and grouped heads SDPA leaves its flash
    kernel for the unfused math path (several times slower on a 512-token prompt)."""
    qb, kb, vb = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale,
                                         enable_gqa=k.shape[1] != q.shape[1])
    return out.squeeze(0).transpose(0, 1)


def fresh_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    query_lens: tuple[int, ...], *, scale: float) -> torch.Tensor:
    """Causal attention of packed prompts that have nothing cached before them: each one
    attends to its own keys and values. Prompts of one length go through one SDPA call."""
    if len(query_lens) == 1:
        return dense_attention(q, k, v, scale=scale)
    if len(set(query_lens)) == 1:
        n = len(query_lens)
        qb, kb, vb = (x.view(n, -1, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale,
                                             enable_gqa=k.shape[1] != q.shape[1])
        return out.transpose(1, 2).reshape(q.shape)
    parts = zip(q.split(query_lens), k.split(query_lens), v.split(query_lens), strict=True)
    return torch.cat([dense_attention(qs, ks, vs, scale=scale) for qs, ks, vs in parts])
