"""Metrics shared by zoo entries, each run in batches through the model under test.

Batching bounds memory on large evaluation sets and matches how engines are driven. An
entry binds the output name (and any per-batch preparation) with ``functools.partial``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from turboinfer.models.zoo import EvalSet, Feeds, RunFn

BATCH = 64
Prepare = Callable[[Feeds], Feeds]


def batches(
    evalset: EvalSet, *, size: int = BATCH, prepare: Prepare | None = None
) -> Iterator[tuple[Feeds, np.ndarray]]:
    """Yield ``(feeds, labels)`` slices of ``evalset``; ``prepare`` may reshape each batch."""
    if evalset.labels is None:
        raise ValueError("this metric needs an evaluation set with labels or references")
    for start in range(0, len(evalset), size):
        feeds = {name: value[start : start + size] for name, value in evalset.inputs.items()}
        yield (prepare(feeds) if prepare else feeds), evalset.labels[start : start + size]


def accuracy(run: RunFn, evalset: EvalSet, *, output: str, prepare: Prepare | None = None) -> float:
    """Percent of samples whose arg-max class equals the label (labels: ``[N]`` ints)."""
    correct = 0
    for feeds, labels in batches(evalset, prepare=prepare):
        predicted = np.asarray(run(feeds)[output]).argmax(axis=-1)
        correct += int((predicted == labels).sum())
    return 100.0 * correct / len(evalset)


def mean_cosine(
    run: RunFn, evalset: EvalSet, *, output: str, prepare: Prepare | None = None
) -> float:
    """Mean cosine similarity of each output row to its reference row (labels: ``[N, D]``)."""
    total = 0.0
    for feeds, reference in batches(evalset, prepare=prepare):
        got = np.asarray(run(feeds)[output], dtype=np.float64)
        ref = reference.astype(np.float64)
        dot = (got * ref).sum(axis=-1)
        norms = np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1)
        total += float((dot / np.maximum(norms, 1e-12)).sum())
    return total / len(evalset)
