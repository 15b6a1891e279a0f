"""The decode step's shortcuts equal the general path: a lone sequence's consecutive
blocks read as a view, the sign-folded rotary, numpy's argmax."""

from __future__ import annotations

import torch

from turboinfer.llm.engine.sampler import argmax_rows
from turboinfer.llm.model.attention import AttentionBatch, KVCache, dense_attention, paged_attention
from turboinfer.llm.model.llama import RotaryEmbedding, apply_rotary, rotate


def _decode_last(table: list[int], n: int) -> tuple[torch.Tensor, torch.Tensor,
                                                     AttentionBatch]:
    """Prefill n - 1 tokens into ``table``'s blocks, then decode the n-th: (out, want, batch)."""
    torch.manual_seed(2)
    heads, kv_heads, dim, bs = 6, 2, 8, 4
    cache = KVCache.allocate(num_layers=1, num_blocks=16, block_size=bs, num_kv_heads=kv_heads,
                             head_dim=dim, dtype=torch.float32)
    q, k, v = (torch.randn(n, h, dim) for h in (heads, kv_heads, kv_heads))
    first = AttentionBatch.build(starts=[0], query_lens=[n - 1], block_tables=[table],
                                 block_size=bs)
    paged_attention(q[:-1], k[:-1], v[:-1], k_cache=cache.k[0], v_cache=cache.v[0],
                    batch=first, scale=0.4)
    step = AttentionBatch.build(starts=[n - 1], query_lens=[1], block_tables=[table],
                                block_size=bs)
    out = paged_attention(q[-1:], k[-1:], v[-1:], k_cache=cache.k[0], v_cache=cache.v[0],
                          batch=step, scale=0.4)
    return out, dense_attention(q, k, v, scale=0.4)[-1:], step


def test_a_lone_sequence_on_consecutive_blocks_decodes_from_a_view() -> None:
    # Blocks 5, 6, 7 hold positions 0..10; block 2 (not yet reached) may be anywhere.
    out, want, step = _decode_last([5, 6, 7, 2], 11)
    assert step.span == (5 * 4, 11) and step.mask is None
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_scattered_blocks_and_batches_take_the_gather() -> None:
    out, want, step = _decode_last([5, 9, 7], 11)
    assert step.span is None and step.mask is not None
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    two = AttentionBatch.build(starts=[3, 3], query_lens=[1, 1], block_tables=[[0], [1]],
                               block_size=4)
    assert two.span is None


def test_sign_folded_rotary_is_bit_for_bit_the_rotate_half_form() -> None:
    rope = RotaryEmbedding(head_dim=16, max_positions=64, theta=10000.0)
    x = torch.randn(5, 3, 16)
    positions = torch.tensor([0, 7, 8, 33, 63])
    cos, sin_signed = rope.tables(positions, x.dtype)
    plain = apply_rotary(x, rope.cos[positions].unsqueeze(1), rope.sin[positions].unsqueeze(1))
    assert torch.equal(rotate(x, cos, sin_signed), plain)


def test_argmax_rows_equals_torch_argmax_with_ties() -> None:
    logits = torch.randn(16, 1000)
    logits[3, [10, 500]] = 100.0        # a tie: the first index wins, as in torch
    assert argmax_rows(logits) == logits.argmax(dim=-1).tolist()
    assert argmax_rows(logits)[3] == 10
    assert argmax_rows(logits[:, ::2]) == logits[:, ::2].argmax(dim=-1).tolist()
