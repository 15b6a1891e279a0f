"""Channel importance criteria, by schedule name, and the gradients Taylor needs.

L1 ranks a channel by the magnitude of its weights: free, and good at removing what is
clearly dead. Taylor ranks by |weight × gradient| on training batches, an estimate of how
much the loss moves when the channel goes: it sees what the data uses, so it makes the
finer cuts once the obvious ones are done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from turboinfer.prune.data import Batch
from turboinfer.prune.requires import torch_pruning

if TYPE_CHECKING:  # annotations only: the module is optional (the prune extra)
    import torch_pruning as tp

# (student output, teacher output, hard labels or None) -> scalar loss
LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class Criterion:
    make: Callable[[], tp.importance.Importance]
    needs_gradients: bool


# group_reduction="mean" scores a channel over every layer that loses it together (the
# whole DepGraph group), not just the layer that roots the group.
CRITERIA: dict[str, Criterion] = {
    "l1": Criterion(lambda: torch_pruning().importance.GroupMagnitudeImportance(p=1),
                    needs_gradients=False),
    "taylor": Criterion(lambda: torch_pruning().importance.GroupTaylorImportance(),
                        needs_gradients=True),
}


def accumulate_gradients(
    model: torch.nn.Module,
    teacher: torch.nn.Module,
    batches: Sequence[Batch],
    loss_fn: LossFn,
) -> None:
    """Leave in ``model``'s ``.grad`` the summed gradients of ``loss_fn`` over ``batches``.

    Eval mode: BatchNorm statistics must not drift and dropout must not add noise to a
    ranking that is taken once.
    """
    model.eval()
    model.zero_grad(set_to_none=True)
    for inputs, labels in batches:
        with torch.no_grad():
            target = teacher(*inputs)
        loss_fn(model(*inputs), target, labels).backward()
