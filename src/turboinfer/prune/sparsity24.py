"""2:4 semi-structured sparsity: in every 4 consecutive weights along the input axis, 2
are zero.

This only pays where the hardware has sparse kernels for it: NVIDIA sparse tensor cores
(Ampere and later), through cuSPARSELt or TensorRT, and torch's
``to_sparse_semi_structured`` is CUDA-only. ONNX Runtime on a CPU multiplies the zeros
like any other weight, so the report carries the measured latency of the dense and the
2:4 model side by side: the honest answer on this machine is that nothing changes.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn

from turboinfer.prune.layers import WEIGHTED

NOTE = (
    "2:4 sparsity speeds up only GPUs with sparse tensor cores (NVIDIA Ampere or later via "
    "cuSPARSELt/TensorRT); ONNX Runtime on CPU runs the zeros as dense math, so expect no "
    "latency change here: the report times the 2:4 model against the same widths without "
    "the zeros"
)

Masks = dict[torch.Tensor, torch.Tensor]  # weight (by identity) -> keep mask


def mask_2to4(weight: torch.Tensor) -> torch.Tensor:
    """Keep the 2 largest-magnitude weights of each 4 along the flattened input axis."""
    rows = weight.detach().reshape(weight.shape[0], -1)  # [out, in * kernel]
    groups = rows.abs().reshape(rows.shape[0], -1, 4)  # [out, in * kernel / 4, 4]
    keep = groups.topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return mask.reshape(weight.shape)


def apply_2to4(model: nn.Module, skip: Collection[nn.Module] = ()) -> Masks:
    """Zero half of each eligible layer's weights in place; the masks, to keep them zero.

    A layer whose flattened input width is not a multiple of 4 cannot hold the pattern
    and is left dense, as are the ``skip`` layers (the protected ones).
    """
    masks: Masks = {}
    for module in model.modules():
        if not isinstance(module, WEIGHTED) or module in skip:
            continue
        weight = module.weight
        if weight[0].numel() % 4:
            continue
        mask = mask_2to4(weight)
        with torch.no_grad():
            weight.mul_(mask)
        masks[weight] = mask
    return masks


def reapply(masks: Masks) -> None:
    """Zero the masked weights again after an optimizer step moved them."""
    with torch.no_grad():
        for weight, mask in masks.items():
            weight.mul_(mask)


def zero_fraction(masks: Masks) -> float:
    """Share of the masked layers' weights that are zero."""
    total = sum(m.numel() for m in masks.values())
    kept = sum(int(m.sum()) for m in masks.values())
    return 1.0 - kept / total if total else 0.0
