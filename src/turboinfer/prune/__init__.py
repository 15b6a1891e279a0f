"""Structured pruning with knowledge distillation (Torch-Pruning's DepGraph underneath).

``prune`` works on any ``torch.nn.Module``; ``prune_model`` runs it on a zoo model or the
user's own PyTorch source and writes the pruned state, its ONNX export and a report;
``prune_for_tune`` is the same for ``tune``, returning the ONNX path and its metric.
"""

from turboinfer.prune.api import PruneResult, prune
from turboinfer.prune.data import TrainData
from turboinfer.prune.pipeline import PrunedModel, prune_for_tune, prune_model
from turboinfer.prune.settings import (
    DistillSettings,
    Objective,
    Phase,
    Protect,
    PruneSettings,
    parse_schedule,
)

__all__ = [
    "DistillSettings",
    "Objective",
    "Phase",
    "Protect",
    "PruneResult",
    "PruneSettings",
    "PrunedModel",
    "TrainData",
    "parse_schedule",
    "prune",
    "prune_for_tune",
    "prune_model",
]
