"""The built-in model zoo: one ``ZooEntry`` per model, found by name in ``_TABLE``.

Adding a model is adding a row to ``_TABLE``. Everything an
optimizer or benchmark needs to judge a model travels with its entry: how to build it,
example inputs of any batch size, a calibration set, an evaluation set and its metric.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from turboinfer.errors import UnknownModelError

Feeds = dict[str, np.ndarray]
# A function that runs the model under test on named inputs: the engine session's ``run``.
RunFn = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class EvalSet:
    """Evaluation inputs (first axis = samples) and, for classifiers, labels."""

    inputs: Feeds
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))


@dataclass(frozen=True)
class Metric:
    """A named score of a model on an evaluation set.

    ``compute(run, evalset)`` runs the model through ``run`` in batches and returns the
    score; ``higher_is_better`` tells optimizers which way a drop goes. ``unit`` is how a
    delta is shown (``"points"`` for accuracy in percent, ``""`` for a cosine).
    """

    name: str
    compute: Callable[[RunFn, EvalSet], float]
    higher_is_better: bool = True
    unit: str = ""


@dataclass(frozen=True)
class ZooEntry:
    """Everything turboinfer knows about one built-in model.

    - ``build``: returns the ``torch.nn.Module`` in eval mode (trained or seeded weights).
    - ``example_inputs(batch)``: feeds of that batch size, real data where the entry has it.
    - ``calibration(count)``: up to ``count`` real samples for quantization calibration.
    - ``evaluation()``: the held-out set the ``metric`` is computed on.
    - ``input_names`` / ``output_names`` / ``dynamic_axes``: the ONNX export signature.
    """

    name: str
    description: str
    build: Callable[[], object]
    example_inputs: Callable[[int], Feeds]
    calibration: Callable[[int], Feeds]
    evaluation: Callable[[], EvalSet]
    metric: Metric
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    # True when the weights are random: speed work only, no accuracy claim.
    random_weights: bool = False
    # Bumped when build, data or metric change; part of every cache key of the entry.
    version: str = "1"


# name -> (module, attribute) holding the entry. The entry modules import torch (seconds),
# so a module is imported only when its entry is first asked for; listing names is free.
_TABLE: dict[str, tuple[str, str]] = {
    "digits-cnn": ("turboinfer.models.digits", "ENTRY"),
    "digits-dsconv": ("turboinfer.models.digits_dsconv", "ENTRY"),
    "resnet18": ("turboinfer.models.resnet", "RESNET18"),
    "resnet50": ("turboinfer.models.resnet", "RESNET50"),
    "minilm": ("turboinfer.models.minilm", "ENTRY"),
}

# Entries loaded so far, by name; a test may add its own model here.
ZOO: dict[str, ZooEntry] = {}


def get_entry(name: str) -> ZooEntry:
    if name not in ZOO and name in _TABLE:
        module, attribute = _TABLE[name]
        ZOO[name] = getattr(importlib.import_module(module), attribute)
    try:
        return ZOO[name]
    except KeyError:
        known = ", ".join(names())
        raise UnknownModelError(f"unknown builtin model {name!r}; known: {known}") from None


def shipped(name: str) -> bool:
    """A built-in of the package itself (not one a test added): another process, a
    server, finds it by name."""
    return name in _TABLE


def names() -> list[str]:
    return sorted(set(_TABLE) | set(ZOO))
