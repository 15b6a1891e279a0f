"""Faster fp32 linear layers on CPU: weights stored transposed, MKL-packed for big batches.

Two effects (benchmarks/llm/run.py records the engine's speed with them):

- **Layout.** ``x @ w_t`` with the weight stored ``[in, out]`` runs MKL's GEMM on its
  preferred layout; ``F.linear`` on the usual ``[out, in]`` weight does not. For the few
  rows of a decode or speculative-verification step this is the larger win.
- **Packing.** MKL can pre-arrange a weight for one batch size so each call at that
  size skips the packing step. At any other size
  ``_mkl_linear`` falls back to ``F.linear`` on the weight it is given, and handing it
  the transposed weight's ``.t()`` view makes that fallback the fast layout above.

Results equal ``F.linear``'s up to float rounding. The packed copy costs extra memory
(more than the weight itself), which a decode-bound CPU deployment can afford; the transposed
copy replaces the original (tied LM heads get their own copy).
"""

from __future__ import annotations

import torch
from torch import nn


def mkl_packing_available() -> bool:
    return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl,
                                                                "_mkl_reorder_linear_weight")


class FastLinear(nn.Module):
    """A drop-in inference-only ``nn.Linear``: transposed weight, optional MKL packing."""

    def __init__(self, linear: nn.Linear, batch_hint: int = 0) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.weight_t: torch.Tensor
        self.register_buffer("weight_t", weight.t().contiguous(), persistent=False)  # [in, out]
        self.packed: torch.Tensor | None = None
        if batch_hint > 0:
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, batch_hint)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(),
                                                                  requires_grad=False)
        self.batch_hint = batch_hint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self.packed is not None:
            out = torch.ops.mkl._mkl_linear(flat, self.packed, self.weight_t.t(), self.bias,
                                            self.batch_hint)
        elif self.bias is not None:
            out = torch.addmm(self.bias, flat, self.weight_t)
        else:
            out = flat @ self.weight_t
        return out.view(*x.shape[:-1], -1)


def pack_linear_layers(model: nn.Module, batch_hint: int) -> int:
    """Swap every fp32 ``nn.Linear`` for a ``FastLinear``; returns how many.

    ``batch_hint`` > 0 also packs each weight for that many rows where MKL can.
    """
    hint = batch_hint if batch_hint > 0 and mkl_packing_available() else 0
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32:
                setattr(parent, name, FastLinear(child, hint))
                replaced += 1
    return replaced
