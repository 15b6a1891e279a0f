"""Batch-size buckets: a batch runs padded up to the next bucket, so a GPU replays one
of a few CUDA graphs (or compiled kernels) instead of needing one per size."""

from __future__ import annotations

import bisect


def bucket_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to ``max_batch_size``, and the maximum itself: at most twice the
    rows a batch needs, and log2(max) + 1 graphs to capture."""
    largest = max(1, max_batch_size)
    sizes = {1 << k for k in range(largest.bit_length()) if 1 << k <= largest}
    sizes.add(largest)
    return tuple(sorted(sizes))


def bucket_for(rows: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds ``rows``; None when none does."""
    index = bisect.bisect_left(buckets, rows)
    return buckets[index] if index < len(buckets) else None
