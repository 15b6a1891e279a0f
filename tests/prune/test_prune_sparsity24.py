from __future__ import annotations

import torch
from torch import nn

from turboinfer.prune.sparsity24 import apply_2to4, mask_2to4, reapply, zero_fraction


def test_mask_keeps_the_two_largest_of_every_four() -> None:
    weight = torch.tensor([[1.0, -4.0, 3.0, 0.5, 0.1, 0.2, -0.3, 0.4]])
    assert mask_2to4(weight).tolist() == [[False, True, True, False,
                                           False, False, True, True]]


def test_apply_zeroes_half_and_reapply_restores_the_pattern() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    masks = apply_2to4(model, skip=[model[2]])
    assert list(masks) == [model[0].weight]
    groups = model[0].weight.detach().reshape(16, -1, 4)
    assert ((groups != 0).sum(dim=-1) == 2).all()
    assert zero_fraction(masks) == 0.5
    with torch.no_grad():
        model[0].weight.add_(1.0)  # what an optimizer step does to the zeros
    reapply(masks)
    assert ((model[0].weight.detach().reshape(16, -1, 4) != 0).sum(dim=-1) == 2).all()
    assert (model[2].weight != 0).all()


def test_layers_that_cannot_hold_the_pattern_stay_dense() -> None:
    model = nn.Sequential(nn.Linear(6, 4))
    assert apply_2to4(model) == {}
