"""Metrics shared by zoo entries, each run in batches through the model under test.

Batching bounds memory on large evaluation sets and matches how engines are driven. An
entry binds the output name (and any per-batch preparation) with ``functools.partial``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from turboinfer.errors import InvalidInputError
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


# Scores of a whole output array against labels (or reference outputs), first axis =
# samples. Percent-like scores (top-1, F1, cosine x 100, relative error) share one scale,
# so a budget in points means a comparable change whichever one is measured.


def collect(run: RunFn, inputs: Feeds, *, output: str | None, size: int = BATCH) -> np.ndarray:
    """The model's ``output`` (its first when None) over ``inputs``, run ``size`` at a time;
    one sample at a time when the model refuses a larger batch (a graph that pins its
    batch axis still gets its accuracy measured)."""
    count = len(next(iter(inputs.values())))
    parts = []
    for start in range(0, count, size):
        try:
            result = run({name: value[start : start + size] for name, value in inputs.items()})
        except InvalidInputError:
            if size == 1:
                raise
            return collect(run, inputs, output=output, size=1)
        parts.append(np.asarray(result[output] if output in result
                                else next(iter(result.values()))))
    return np.concatenate(parts)


def top1(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Percent of rows whose arg-max over the last axis equals the label."""
    return 100.0 * float((outputs.argmax(axis=-1) == labels.reshape(-1)).mean())


def _classes(outputs: np.ndarray) -> np.ndarray:
    if outputs.ndim > 1 and outputs.shape[-1] > 1:
        return outputs.argmax(axis=-1).reshape(-1)
    return (outputs.reshape(-1) > 0).astype(np.int64)  # one logit: positive above zero


def macro_f1(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Macro-averaged F1 in percent; one-column outputs are binary logits."""
    predicted, truth = _classes(outputs), labels.reshape(-1).astype(np.int64)
    scores = []
    for label in np.union1d(predicted, truth):
        hit = float(((predicted == label) & (truth == label)).sum())
        total = float((predicted == label).sum() + (truth == label).sum())
        scores.append(2.0 * hit / total if total else 1.0)
    return 100.0 * float(np.mean(scores))


def cosine_points(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Mean cosine x 100 of each vector (last axis) to its label vector."""
    got = outputs.astype(np.float64).reshape(-1, outputs.shape[-1])
    ref = labels.astype(np.float64).reshape(-1, outputs.shape[-1])
    dot = (got * ref).sum(axis=-1)
    norms = np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1)
    return 100.0 * float(np.mean(dot / np.maximum(norms, 1e-12)))


def mean_abs_error(outputs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.abs(outputs.astype(np.float64) - labels.reshape(outputs.shape)).mean())


def relative_error_points(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean absolute error in percent of the reference's mean magnitude."""
    scale = max(float(np.abs(reference.astype(np.float64)).mean()), 1e-12)
    return 100.0 * mean_abs_error(outputs, reference) / scale
