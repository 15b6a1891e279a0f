"""FP16 weights and compute, with FP32 inputs and outputs and fragile ops kept FP32."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

log = logging.getLogger(__name__)

# Ops whose FP16 results drift or overflow: exponentials, reductions over many values,
# and normalisations that divide by a small variance. Kept in FP32 with casts around.
FRAGILE_OPS = (
    "Softmax", "LogSoftmax", "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Div",
    "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp",
    "LayerNormalization", "SkipLayerNormalization", "InstanceNormalization",
    "GroupNormalization", "Erf", "Range", "CumSum",
)


def convert_fp16(src: Path, dst: Path) -> Path:
    """Convert ``src`` to FP16; the caller's inputs and outputs stay FP32."""
    model = onnx.load(str(src))
    converted = convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=sorted(set(DEFAULT_OP_BLOCK_LIST) | set(FRAGILE_OPS)),
    )
    onnx.save(converted, str(dst))
    return dst
