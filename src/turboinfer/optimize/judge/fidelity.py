"""Fidelity to the FP32 model, the metric of last resort: when the user gives no labels,
a variant is scored on how closely it reproduces the FP32 model's outputs on samples
held out of the calibration data (never the samples the ranges were computed on).

The kind follows the model's first output: class scores (``[N, C]``, C > 1) are compared
by top-1 agreement, embeddings (rank 3 and more, or a 2-D output whose name says
embedding/pooled/hidden/feature) by mean cosine, anything else by relative error. All
three are in percent, so ``--max-accuracy-drop 1`` allows one point of disagreement,
0.01 of cosine, or 1 % of relative error.
"""

from __future__ import annotations

import numpy as np

from turboinfer.models import metrics
from turboinfer.models.zoo import Feeds, RunFn
from turboinfer.optimize.judge.evaluation import Evaluator

PREFIX = "fidelity:"
# Names of a 2-D output that hold embeddings rather than class scores.
_EMBEDDING_WORDS = ("embed", "pool", "hidden", "feature", "sentence", "vector")


def fidelity_kind(output: np.ndarray, name: str) -> str:
    embedding = any(word in name.lower() for word in _EMBEDDING_WORDS)
    if output.ndim >= 3 or (output.ndim == 2 and embedding and output.shape[-1] > 1):
        return "cosine"
    if output.ndim == 2 and output.shape[-1] > 1 and np.issubdtype(output.dtype, np.floating):
        return "top1-agreement"
    return "relative-error"


def fidelity_evaluator(reference: RunFn, held_out: Feeds, *, output: str, batch: int,
                       source: str) -> Evaluator:
    """Scores against ``reference``'s ``output`` on ``held_out``, computed once here."""
    expected = metrics.collect(reference, held_out, output=output, size=batch)
    kind = fidelity_kind(expected, output)
    count = len(expected)
    if kind == "top1-agreement":
        labels = expected.argmax(axis=-1)

        def score(got: np.ndarray) -> float:
            return metrics.top1(got, labels)
    elif kind == "cosine":
        def score(got: np.ndarray) -> float:
            return metrics.cosine_points(got, expected)
    else:
        def score(got: np.ndarray) -> float:
            return metrics.relative_error_points(got, expected)

    return Evaluator(
        PREFIX + kind, "points", kind != "relative-error",
        lambda run: score(metrics.collect(run, held_out, output=output, size=batch)),
        f"{kind} with the FP32 model's output {output!r} on {count} samples held out of "
        f"the calibration data ({source})")
