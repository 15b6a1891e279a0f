"""Fixed-size KV-cache blocks: allocation, reference counts and prefix caching.

A block holds ``block_size`` consecutive tokens of one or more sequences. Full blocks
are identified by a hash chain (hash of the previous block's hash and this block's
tokens), so two prompts with the same prefix map to the same blocks. The hash is
cryptographic (BLAKE2b over the parent digest and the token ids): Python's built-in
``hash`` is cheap to collide on purpose, and a collision would let one user's prompt
read another's cached keys and values. A block whose
reference count drops to zero goes to the back of the free queue but keeps its hash:
it can still be reused by a later prompt until it reaches the front of the queue and
is handed out for new tokens (least recently used eviction).
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass, field

from turboinfer.llm.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None
    token_ids: tuple[int, ...] = field(default=())


def chain_hash(prev: bytes | None, token_ids: tuple[int, ...]) -> bytes:
    """Digest of (parent digest, token ids); 32 bytes, so collisions are out of reach."""
    h = hashlib.blake2b(prev or b"", digest_size=32)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *,
                 enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Insertion order is eviction order: the front is the least recently freed.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._hash_to_block: dict[bytes, int] = {}
        # Per sequence: hashes of its leading full, computed blocks (the chain so far).
        self._seq_hashes: dict[int, list[bytes]] = {}
        self.prefix_hits = 0
        self.prefix_queries = 0

    # -- queries -----------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of ``seq``'s tokens.

        The last token is never served from the cache: the model must run on at least
        one token to produce the next-token logits, and that token's KV would otherwise
        be written into a block other sequences share.
        """
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        prev: bytes | None = None
        bs = self.block_size
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            prev = chain_hash(prev, tokens)
            block_id = self._hash_to_block.get(prev)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._cached_prefix(seq)
        # A hit on a block still in use costs nothing; a hit on a freed block takes it
        # out of the free queue like a fresh allocation would.
        shared = sum(1 for b in hits if self.blocks[b].ref_count > 0)
        return self.blocks_needed(seq.num_tokens) - shared <= self.num_free_blocks

    def can_append(self, seq: Sequence, num_lookahead: int = 0) -> bool:
        """Whether the blocks for ``num_tokens + num_lookahead`` slots can be had."""
        need = self.blocks_needed(seq.num_tokens + num_lookahead) - len(seq.block_table)
        return need <= self.num_free_blocks

    # -- commands ----------------------------------------------------------------------

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` a block table covering all its tokens, reusing cached blocks."""
        assert not seq.block_table, "sequence already has blocks"
        hits = self._cached_prefix(seq)
        self.prefix_queries += (seq.num_tokens - 1) // self.block_size
        self.prefix_hits += len(hits)
        hashes = self._seq_hashes.setdefault(seq.seq_id, [])
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            assert block.hash is not None
            hashes.append(block.hash)
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        for _ in range(self.blocks_needed(seq.num_tokens) - len(hits)):
            seq.block_table.append(self._take_free())

    def append_slots(self, seq: Sequence, num_lookahead: int = 0) -> None:
        """Grow the block table to hold ``num_tokens + num_lookahead`` tokens."""
        while len(seq.block_table) < self.blocks_needed(seq.num_tokens + num_lookahead):
            seq.block_table.append(self._take_free())

    def commit(self, seq: Sequence) -> None:
        """Publish ``seq``'s full, computed blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        hashes = self._seq_hashes.setdefault(seq.seq_id, [])
        bs = self.block_size
        for i in range(len(hashes), seq.num_computed_tokens // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(hashes[-1] if hashes else None, tokens)
            hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if h in self._hash_to_block:
                continue  # an identical block is already published; keep the first
            block.hash, block.token_ids = h, tokens
            self._hash_to_block[h] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references. Tail blocks go first into the free queue, so they
        are evicted before the shared prefix blocks they depend on."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_draft_computed = 0
        self._seq_hashes.pop(seq.seq_id, None)

    def _take_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            # Evicting a cached block: later lookups must no longer find it.
            if self._hash_to_block.get(block.hash) == block_id:
                del self._hash_to_block[block.hash]
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id
