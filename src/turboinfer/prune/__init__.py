"""Structured pruning with knowledge distillation (Torch-Pruning's DepGraph underneath).

``prune`` works on any ``torch.nn.Module``; ``prune_builtin`` runs it on a zoo model and
writes the pruned state, its ONNX export and a report; ``prune_for_tune`` is the same for
``tune``, returning the ONNX path and its metric.
"""

from turboinfer.prune.api import PruneResult, prune
from turboinfer.prune.data import TrainData
from turboinfer.prune.pipeline import PrunedModel, prune_builtin, prune_for_tune
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
    "prune_builtin",
    "prune_for_tune",
]
