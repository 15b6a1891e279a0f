"""Paged attention over scattered blocks equals dense causal attention."""

from __future__ import annotations

import pytest
import torch

from turboinfer.llm.model.attention import (
    AttentionBatch,
    KVCache,
    dense_attention,
    grouped_decode_attention,
    paged_attention,
)


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="needs CUDA"))])
def test_paged_equals_dense_for_mixed_prefill_and_decode(device: str) -> None:
    # On CUDA the decode step takes grouped_decode_attention (grouped heads, a mask).
    torch.manual_seed(0)
    heads, kv_heads, dim, bs = 4, 2, 8, 4
    cache = KVCache.allocate(num_layers=1, num_blocks=16, block_size=bs, num_kv_heads=kv_heads,
                             head_dim=dim, dtype=torch.float32, device=torch.device(device))
    lens = [7, 10, 3]
    q = [torch.randn(n, heads, dim).to(device) for n in lens]
    k = [torch.randn(n, kv_heads, dim).to(device) for n in lens]
    v = [torch.randn(n, kv_heads, dim).to(device) for n in lens]
    # Deliberately non-contiguous, interleaved block tables.
    tables = [[9, 2], [5, 0, 14], [7]]
    # Step 1: prefill everything but the last token of each sequence.
    first = AttentionBatch.build(starts=[0, 0, 0], query_lens=[n - 1 for n in lens],
                                 block_tables=tables, block_size=bs,
                                 device=torch.device(device))
    paged_attention(torch.cat([x[:-1] for x in q]), torch.cat([x[:-1] for x in k]),
                    torch.cat([x[:-1] for x in v]), k_cache=cache.k[0], v_cache=cache.v[0],
                    batch=first, scale=dim ** -0.5)
    # Step 2: one decode token per sequence against the cached prefix.
    step = AttentionBatch.build(starts=[n - 1 for n in lens], query_lens=[1, 1, 1],
                                block_tables=tables, block_size=bs,
                                device=torch.device(device))
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


def test_grouped_decode_attention_equals_sdpa_over_expanded_heads() -> None:
    """A GPU's decode step folds each key/value head's query heads into query rows
    (grouped_decode_attention); the same numbers as SDPA over grouped heads, under a
    mask that hides a different tail of each sequence."""
    torch.manual_seed(0)
    seqs, heads, kv_heads, dim, length = 3, 12, 4, 16, 20
    q = torch.randn(seqs, heads, dim)
    keys, values = torch.randn(seqs, length, kv_heads, dim), torch.randn(seqs, length,
                                                                         kv_heads, dim)
    visible = torch.arange(length)[None, :] < torch.tensor([20, 7, 13])[:, None]
    mask = torch.zeros(seqs, 1, 1, length).masked_fill_(~visible[:, None, None, :],
                                                        float("-inf"))
    got = grouped_decode_attention(q, keys, values, mask, scale=dim ** -0.5)
    # Each query head h reads key/value head h // 3.
    expanded = [x.repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)
                for x in (keys, values)]
    want = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None, :], *expanded, attn_mask=mask, scale=dim ** -0.5)[:, :, 0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
