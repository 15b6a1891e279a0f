"""Block allocation, reference counts, prefix-cache hits and LRU eviction."""

from __future__ import annotations

from turboinfer.llm.engine.block_manager import BlockManager
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.sequence import Sequence


def seq(tokens: list[int]) -> Sequence:
    return Sequence(tokens, SamplingParams())


def computed(bm: BlockManager, s: Sequence) -> None:
    s.num_computed_tokens = s.num_tokens
    bm.commit(s)


def test_allocate_append_free_returns_every_block() -> None:
    bm = BlockManager(8, 4)
    a, b = seq(list(range(6))), seq(list(range(100, 109)))
    bm.allocate(a)
    bm.allocate(b)
    assert len(a.block_table) == 2 and len(b.block_table) == 3
    assert bm.num_free_blocks == 3
    a.token_ids += [6, 7, 8]
    assert bm.can_append(a)
    bm.append_slots(a)
    assert len(a.block_table) == 3
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8
    assert all(block.ref_count == 0 for block in bm.blocks)


def test_shared_prefix_reuses_blocks_and_counts_references() -> None:
    bm = BlockManager(16, 4)
    a = seq(list(range(10)))
    bm.allocate(a)
    computed(bm, a)
    b = seq([*range(8), 50, 51, 52])  # same first two blocks
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    bm.free(a)
    assert bm.blocks[b.block_table[0]].ref_count == 1
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_freed_blocks_stay_cached_until_evicted_lru() -> None:
    bm = BlockManager(4, 4)
    a = seq(list(range(9)))
    bm.allocate(a)
    computed(bm, a)
    bm.free(a)
    again = seq(list(range(9)))
    assert bm.can_allocate(again)
    bm.allocate(again)
    assert again.num_cached_tokens == 8  # both full blocks came back from the cache
    bm.free(again)
    # Fill the whole cache with other tokens: the cached blocks are evicted.
    other = seq(list(range(200, 216)))
    bm.allocate(other)
    bm.free(other)
    third = seq(list(range(9)))
    bm.allocate(third)
    assert third.num_cached_tokens == 0
    bm.free(third)
    assert bm.num_free_blocks == 4


def test_last_token_is_never_served_from_cache() -> None:
    bm = BlockManager(8, 4)
    a = seq(list(range(8)))
    bm.allocate(a)
    computed(bm, a)
    b = seq(list(range(8)))
    bm.allocate(b)
    # Only the first block is reused; the second holds the token the model must run on.
    assert b.num_cached_tokens == 4
    assert b.block_table[1] != a.block_table[1]


def test_cannot_allocate_beyond_capacity() -> None:
    bm = BlockManager(2, 4)
    assert not bm.can_allocate(seq(list(range(9))))
    assert bm.can_allocate(seq(list(range(8))))
