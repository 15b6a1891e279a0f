"""Which layers a model has, in the order it runs them, and how wide each one is."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import nn

from turboinfer.prune.settings import Protect

# Layers whose width Torch-Pruning changes and whose shape a report shows.
WEIGHTED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass(frozen=True)
class LayerWidth:
    name: str
    kind: str
    in_channels: int
    out_channels: int

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "in": self.in_channels,
                "out": self.out_channels}


def execution_order(
    model: nn.Module, example_inputs: tuple[torch.Tensor, ...]
) -> list[nn.Module]:
    """Conv and linear layers in the order one forward pass calls them (first call wins)."""
    order: list[nn.Module] = []

    def record(module: nn.Module, *_: object) -> None:
        if module not in order:
            order.append(module)

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, WEIGHTED)]
    try:
        with torch.no_grad():
            model.eval()(*example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    return order


def protected_layers(
    model: nn.Module, example_inputs: tuple[torch.Tensor, ...], protect: Collection[Protect]
) -> list[nn.Module]:
    """The first layer to see the input and the last to shape the output, as asked.

    Torch-Pruning keeps the output channels of a protected layer; its input channels
    can still follow a pruned layer before it.
    """
    order = execution_order(model, example_inputs)
    if not order:
        return []
    chosen = []
    if Protect.FIRST in protect:
        chosen.append(order[0])
    if Protect.LAST in protect and order[-1] not in chosen:
        chosen.append(order[-1])
    return chosen


def widths(model: nn.Module) -> list[LayerWidth]:
    """Every conv and linear layer with its current input and output width."""
    rows = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            rows.append(LayerWidth(name, "Linear", module.in_features, module.out_features))
        elif isinstance(module, nn.modules.conv._ConvNd):
            rows.append(LayerWidth(name, type(module).__name__, module.in_channels,
                                   module.out_channels))
    return rows


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
