"""Paged attention over scattered blocks equals dense causal attention."""

from __future__ import annotations

import torch

from turboinfer.llm.model.attention import AttentionBatch, KVCache, dense_attention, paged_attention


def test_paged_equals_dense_for_mixed_prefill_and_decode() -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, bs = 4, 2, 8, 4
    cache = KVCache.allocate(num_layers=1, num_blocks=16, block_size=bs, num_kv_heads=kv_heads,
                             head_dim=dim, dtype=torch.float32)
    lens = [7, 10, 3]
    q = [torch.randn(n, heads, dim) for n in lens]
    k = [torch.randn(n, kv_heads, dim) for n in lens]
    v = [torch.randn(n, kv_heads, dim) for n in lens]
    # Deliberately non-contiguous, interleaved block tables.
    tables = [[9, 2], [5, 0, 14], [7]]
    # Step 1: prefill everything but the last token of each sequence.
    first = AttentionBatch.build(starts=[0, 0, 0], query_lens=[n - 1 for n in lens],
                                 block_tables=tables, block_size=bs)
    paged_attention(torch.cat([x[:-1] for x in q]), torch.cat([x[:-1] for x in k]),
                    torch.cat([x[:-1] for x in v]), k_cache=cache.k[0], v_cache=cache.v[0],
                    batch=first, scale=dim ** -0.5)
    # Step 2: one decode token per sequence against the cached prefix.
    step = AttentionBatch.build(starts=[n - 1 for n in lens], query_lens=[1, 1, 1],
                                block_tables=tables, block_size=bs)
    out = paged_attention(torch.cat([x[-1:] for x in q]), torch.cat([x[-1:] for x in k]),
                          torch.cat([x[-1:] for x in v]), k_cache=cache.k[0],
                          v_cache=cache.v[0], batch=step, scale=dim ** -0.5)
    for i in range(3):
        want = dense_attention(q[i], k[i], v[i], scale=dim ** -0.5)[-1]
        torch.testing.assert_close(out[i], want, atol=1e-5, rtol=1e-5)


def test_paged_chunk_equals_dense() -> None:
    torch.manual_seed(1)
    heads, dim, bs = 2, 8, 4
    cache = KVCache.allocate(num_layers=1, num_blocks=8, block_size=bs, num_kv_heads=heads,
                             head_dim=dim, dtype=torch.float32)
    n = 11
    q, k, v = (torch.randn(n, heads, dim) for _ in range(3))
    table = [3, 6, 1]
    outs = []
    for start, end in [(0, 5), (5, 11)]:  # a prompt prefilled in two chunks
        batch = AttentionBatch.build(starts=[start], query_lens=[end - start],
                                     block_tables=[table], block_size=bs)
        outs.append(paged_attention(q[start:end], k[start:end], v[start:end],
                                    k_cache=cache.k[0], v_cache=cache.v[0], batch=batch,
                                    scale=0.3))
    torch.testing.assert_close(torch.cat(outs), dense_attention(q, k, v, scale=0.3),
                               atol=1e-5, rtol=1e-5)
