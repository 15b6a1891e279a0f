"""Prompts with nothing cached before them attend to their own keys and values (causal
SDPA, no cache read, no mask): the result equals the paged path's, and the cache they
leave behind serves later steps."""

from __future__ import annotations

import dataclasses

import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.runner import ModelRunner
from turboinfer.llm.model.attention import (
    AttentionBatch,
    KVCache,
    _additive,
    dense_attention,
    paged_attention,
)
from turboinfer.llm.model.llama import LlamaModel


def _masked(batch: AttentionBatch, starts: list[int], block_size: int) -> AttentionBatch:
    """The same step as the paged path runs it: explicit mask over the gathered cache."""
    key_pos = torch.arange(batch.block_tables.shape[1] * block_size)
    query_pos = torch.tensor(starts)[:, None] + torch.arange(batch.max_query_len)[None, :]
    allowed = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
    return dataclasses.replace(batch, mask=_additive(allowed), fresh=False)


def test_fresh_prompts_equal_the_paged_path_and_fill_the_cache() -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, bs = 6, 2, 8, 4
    for lens in ([9], [5, 5, 5], [7, 3, 10]):     # one, equal lengths, mixed lengths
        tables = [[9, 2, 11], [5, 0, 14], [7, 1, 3]][:len(lens)]
        q, k, v = (torch.randn(sum(lens), h, dim) for h in (heads, kv_heads, kv_heads))
        batch = AttentionBatch.build(starts=[0] * len(lens), query_lens=lens,
                                     block_tables=tables, block_size=bs)
        assert batch.fresh and batch.mask is None
        outs, caches = [], []
        for b in (batch, _masked(batch, [0] * len(lens), bs)):
            cache = KVCache.allocate(num_layers=1, num_blocks=16, block_size=bs,
                                     num_kv_heads=kv_heads, head_dim=dim, dtype=torch.float32)
            outs.append(paged_attention(q, k, v, k_cache=cache.k[0], v_cache=cache.v[0],
                                        batch=b, scale=dim ** -0.5))
            caches.append(cache)
        torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
        for i, (qs, ks, vs) in enumerate(zip(q.split(lens), k.split(lens), v.split(lens),
                                             strict=True)):
            want = dense_attention(qs, ks, vs, scale=dim ** -0.5)
            torch.testing.assert_close(outs[0].split(lens)[i], want, atol=1e-5, rtol=1e-5)


def test_a_step_with_a_cached_prefix_is_not_fresh() -> None:
    batch = AttentionBatch.build(starts=[0, 4], query_lens=[3, 2], block_tables=[[0], [1, 2]],
                                 block_size=4)
    assert not batch.fresh and batch.mask is not None


def test_fresh_prefill_logits_equal_a_prefill_behind_a_cached_prefix(
        tiny_model: LlamaModel) -> None:
    # The same prompt prefilled whole (fresh path) and as prefix + rest (paged path for
    # the rest) gives the same last-token logits, and so does decoding one more token
    # against either cache.
    prompt = [5, 17, 99, 3, 42, 7, 64, 1, 2, 88, 31, 9, 4]
    table = [3, 0, 6, 2]
    logits = []
    for chunks in ([(0, len(prompt))], [(0, 8), (8, len(prompt))]):
        runner = ModelRunner(tiny_model, tiny_model.allocate_kv_cache(8, 4))
        for start, end in chunks:
            out = runner.run([StepItem(prompt[start:end], start, table, 1)])
        nxt = runner.run([StepItem([int(out.argmax())], len(prompt), table, 1)])
        logits.append((out, nxt))
    for a, b in zip(logits[0], logits[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
