"""A layer's elementwise groups fused by torch.compile, for decode steps captured as
CUDA graphs.

Between its matmuls and attention, a decode step of a Llama launches small elementwise
kernels: the residual add and the RMS norm after it, the rotary embedding of q and k
(a roll, two products and a sum), SiLU and the product with the up projection: 10 of
the 19 operations of a layer in a decode step (counted by torch's profiler on the
static step). In a CUDA graph each still takes a few microseconds of the GPU, which at
batch 1 adds up to a share of the step comparable to reading a 1B model's weights.
torch.compile (inductor) makes each group one kernel: 4 where there were 10.

Only inside a graph: a compiled function checks its guards on the host at every eager
call (tens of microseconds), which a graph's replay does not run. Compiled with dynamic
shapes, so every batch-size bucket reuses one compilation. ``select.device_decoder``
keeps the fused graphs only where a step measured faster on them; where compiling
fails (no Triton, no C++ compiler) they are left out with the reason.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.model.llama import RMSNorm, StepOps, add_norm, norm, rotate, silu_mul


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    x = x + delta
    return x, F.rms_norm(x, (x.shape[-1],), weight, eps)


@functools.cache
def fused_ops(backend: str = "inductor") -> StepOps:
    """The compiled groups, one set per process and compiler ``backend`` (each compiles
    on its first call); inductor fuses, the others are torch.compile's checks."""

    def compiled(fn):  # type: ignore[no-untyped-def]
        return torch.compile(fn, backend=backend, dynamic=True, fullgraph=True)

    fused_norm, fused_add_norm = compiled(_rms_norm), compiled(_add_rms_norm)

    def norm_by(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
        # A norm that does more than normalize (expert prefetch) keeps its own forward.
        if type(module) is not RMSNorm:
            return norm(x, module)
        return fused_norm(x, module.weight, module.eps)

    def add_norm_by(x: torch.Tensor, delta: torch.Tensor, module: nn.Module,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        if type(module) is not RMSNorm:
            return add_norm(x, delta, module)
        return fused_add_norm(x, delta, module.weight, module.eps)

    return StepOps(norm=norm_by, add_norm=add_norm_by, rotate=compiled(rotate),
                   silu_mul=compiled(silu_mul))
