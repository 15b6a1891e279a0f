"""What pruning works on: the module, its training data, its metric and its export.

``PruneTarget`` is the same for a built-in and for the user's own source; where each
comes from is ``prune/sources.py`` (built-ins and factories) and ``prune/text_target.py``
(Hugging Face encoder folders).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from turboinfer.errors import ConfigError
from turboinfer.models.zoo import Feeds
from turboinfer.prune.api import EvalFn
from turboinfer.prune.data import TrainData, load_text
from turboinfer.prune.settings import Objective

TEXT_LENGTH = 128  # sentence encoders' training length, and the latency measurement's


@dataclass(frozen=True)
class Signature:
    """The ONNX export's names and dynamic axes, the same for the original and the pruned."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: Mapping[str, Mapping[int, str]]


@dataclass(frozen=True)
class PruneTarget:
    """A model ready for ``prune``: ``module`` is pruned in place.

    ``exported(module)`` is the part written to ONNX (the module itself, or the encoder
    inside a pooling wrapper that only shapes the training objective).
    ``original_onnx`` is the unpruned model's file when one exists already (built-ins);
    otherwise the pipeline exports the teacher.
    """

    name: str
    module: nn.Module
    objective: Objective
    example_inputs: tuple[torch.Tensor, ...]
    train_data: TrainData
    eval_fn: EvalFn | None
    metric_name: str
    signature: Signature
    latency_feeds: Callable[[int], Feeds]
    export_examples: Callable[[], tuple[torch.Tensor, ...]]
    exported: Callable[[nn.Module], nn.Module] = lambda module: module
    original_onnx: Path | None = None


def module_runner(
    module: nn.Module, names: tuple[str, ...]
) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """Drive a torch module the way the metrics drive an engine session: by input name."""

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = (torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names)
        with torch.no_grad():
            result = module(*args)
        first = result[0] if isinstance(result, tuple | list) else result
        return {"output": first.detach().numpy()}

    return run


def text_lines(path: Path, role: str) -> tuple[str, ...]:
    """One text per non-empty line (a clear error when the file is not text)."""
    try:
        return load_text(path)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("training", role, 1)) from None
