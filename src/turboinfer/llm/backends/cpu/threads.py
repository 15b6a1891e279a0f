"""The engine's intra-op thread count: candidates from the hardware profile, the pick by
measurement.

More threads are not always faster: on a shared 2-core machine one thread decoded faster
than two, because every op waited for a descheduled worker thread. The profile says how
many cores this process may use (affinity, cgroup quota, SMT siblings counted once); each
candidate count from 1 up to that is timed in interleaved rounds on a decode-shaped
product (the model's widest projection at 1 row and at 16 rows), and the fastest kept,
where a larger count must beat a smaller one by 10%. The choice is remembered per machine
and shape with the kernels' (``decision_cache``): timing a 1B model's widest projection
took 1.1 s of every start on a 2-core Zen 4, and a count that flips between starts also
sends the kernel choices, kept per count, to be timed again.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from turboinfer.hardware.cpu import read_cpu
from turboinfer.llm.backends.cpu import decision_cache

ROUNDS = 5
ROW_COUNTS = (1, 16)
# More threads must be this much faster to be chosen: on a shared machine an extra
# thread that measured a little faster once costs much more when a neighbour wakes up.
MARGIN = 0.9


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    usable_cores: int
    # Median ms of the probe (1 row plus 16 rows) at each candidate count.
    timings_ms: dict[str, float]
    remembered: bool = False    # read from the decision file, not timed in this process

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def candidate_counts(usable: int) -> list[int]:
    """1, 2, 4, ... and ``usable`` itself."""
    counts, n = [], 1
    while n < usable:
        counts.append(n)
        n *= 2
    return [*counts, usable]


@torch.inference_mode()
def choose_threads(in_features: int, out_features: int, *,
                   usable: int | None = None) -> ThreadChoice:
    """Time the probe at each candidate count (or read the count this machine chose
    before for the shape); leaves torch at the fastest."""
    usable = usable or read_cpu().usable_physical_cores
    key = f"threads|{in_features}x{out_features}|usable {usable}"
    stored = decision_cache.load(key)
    if stored is not None and stored.get("threads") in candidate_counts(usable):
        torch.set_num_threads(int(stored["threads"]))
        return ThreadChoice(int(stored["threads"]), usable,
                            dict(stored.get("timings_ms") or {}), remembered=True)
    counts = candidate_counts(usable)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(in_features, out_features, generator=gen)
    inputs = [torch.randn(rows, in_features, generator=gen) for rows in ROW_COUNTS]
    samples: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(ROUNDS if len(counts) > 1 else 0):
        for n in counts:
            torch.set_num_threads(n)
            for x in inputs:
                x @ weight  # after a switch the pool wakes up; not part of the timing
            start = time.perf_counter()
            for x in inputs:
                x @ weight
            samples[n].append(time.perf_counter() - start)
    timings = {str(n): 1e3 * statistics.median(s) for n, s in samples.items() if s}
    best = counts[0]
    for n in counts[1:]:
        if timings[str(n)] < MARGIN * timings[str(best)]:
            best = n
    torch.set_num_threads(best)
    choice = ThreadChoice(best, usable, timings)
    decision_cache.store(key, {"threads": best, "timings_ms": timings})
    return choice
