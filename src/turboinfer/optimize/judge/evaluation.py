"""What a variant's metric is measured on: the zoo's evaluation set, the user's labelled
data (``--eval-data``), or the user's own function.

``--eval-data`` takes
- ``FILE.npz``: one array per model input name plus ``labels``, first axis = samples;
- a folder of ``NAME.npy`` files, the same arrays one per file (``labels.npy``);
- ``package.module:function``: the user's metric. It is called once per variant with
  ``run``, a function from a dict of input arrays (one batch, first axis = samples) to a
  dict of output arrays, and returns one number. Higher is better unless the function
  carries ``higher_is_better = False``; ``metric_name`` and ``unit`` attributes name it
  in the report.

Built-in metrics over labels (``--metric``): ``top1`` (percent of arg-max == label),
``f1`` (macro F1 in percent; a one-column output is a binary logit), ``cosine`` (mean
cosine x 100) and ``mae`` (mean absolute error, lower is better). Unless chosen, it is
inferred: integer labels give ``top1`` for an output of several columns, ``f1`` for one;
float labels give ``cosine`` for outputs of rank 3 or more (token embeddings), ``mae``
otherwise.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.models import metrics
from turboinfer.models.zoo import EvalSet, RunFn, ZooEntry
from turboinfer.optimize.data.calibration import conform, read_user_data
from turboinfer.optimize.settings import MetricKind

LABELS = "labels"


@dataclass(frozen=True)
class Evaluator:
    """One metric, bound to its data: ``compute(run)`` runs the model under test."""

    name: str
    unit: str
    higher_is_better: bool
    compute: Callable[[RunFn], float]
    description: str = ""


@dataclass(frozen=True)
class Kind:
    score: Callable[[np.ndarray, np.ndarray], float]
    higher_is_better: bool
    unit: str


KINDS: dict[MetricKind, Kind] = {
    MetricKind.TOP1: Kind(metrics.top1, True, "points"),
    MetricKind.F1: Kind(metrics.macro_f1, True, "points"),
    MetricKind.COSINE: Kind(metrics.cosine_points, True, "points (cosine x 100)"),
    MetricKind.MAE: Kind(metrics.mean_abs_error, False, "label unit"),
}


def zoo_evaluator(entry: ZooEntry, evalset: EvalSet) -> Evaluator:
    metric = entry.metric
    return Evaluator(metric.name, metric.unit, metric.higher_is_better,
                     lambda run: float(metric.compute(run, evalset)),
                     f"{metric.name} on the built-in evaluation set ({len(evalset)} samples)")


def user_evaluator(ref: str, kind: MetricKind | None, specs: list[TensorSpec],
                   reference: RunFn, batch: int) -> Evaluator:
    """The evaluator ``--eval-data`` names; ``reference`` (the FP32 model) shows the output
    shape when the metric is inferred."""
    path = Path(ref).expanduser()
    if not path.exists():
        return hook_evaluator(ref)
    arrays = read_user_data(path)
    if LABELS not in arrays:
        raise ConfigError(f"--eval-data {ref} has no 'labels' array; give one, or omit "
                          "--eval-data to measure fidelity to the FP32 model")
    labels = arrays.pop(LABELS)
    inputs = conform(arrays, specs, what="evaluation data")
    if len(labels) != len(next(iter(inputs.values()))):
        raise InvalidInputError(f"--eval-data {ref}: {len(labels)} labels for "
                                f"{len(next(iter(inputs.values())))} samples")
    sample = metrics.collect(reference, {k: v[:batch] for k, v in inputs.items()},
                             output=None, size=batch)
    chosen = kind or infer_kind(labels, sample)
    spec = KINDS[chosen]
    return Evaluator(chosen.value, spec.unit, spec.higher_is_better,
                     lambda run: spec.score(metrics.collect(run, inputs, output=None,
                                                            size=batch), labels),
                     f"{chosen.value} against the labels of {ref} ({len(labels)} samples)")


def infer_kind(labels: np.ndarray, output: np.ndarray) -> MetricKind:
    if np.issubdtype(labels.dtype, np.integer) or labels.dtype == np.bool_:
        wide = output.ndim > 1 and output.shape[-1] > 1
        return MetricKind.TOP1 if wide else MetricKind.F1
    return MetricKind.COSINE if output.ndim >= 3 else MetricKind.MAE


def hook_evaluator(ref: str) -> Evaluator:
    """``package.module:function``, imported like ``python -m`` would."""
    module_name, _, attribute = ref.partition(":")
    function = getattr(_import(module_name, ref), attribute, None)
    if not callable(function):
        raise ConfigError(f"--eval-data {ref}: module {module_name!r} has no function "
                          f"{attribute!r}")
    name = str(getattr(function, "metric_name", attribute))
    higher = bool(getattr(function, "higher_is_better", True))

    def compute(run: RunFn) -> float:
        try:
            value = float(function(run))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"--eval-data {ref} must return one number: {exc}") from None
        if not np.isfinite(value):
            raise ConfigError(f"--eval-data {ref} returned {value}")
        return value

    return Evaluator(name, str(getattr(function, "unit", "")), higher, compute,
                     f"{name} from {ref}")


def _import(module_name: str, ref: str) -> object:
    # Like `python -m`, a module in the working directory is found without installing it.
    added = str(Path.cwd()) not in sys.path
    if added:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--eval-data {ref}: cannot import {module_name!r} ({exc}); run "
                          "from the folder that holds it or add it to PYTHONPATH") from None
    finally:
        if added:
            sys.path.remove(str(Path.cwd()))
