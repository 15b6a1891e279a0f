"""Quantizers: INT8 dynamic, INT8 static (QDQ, per-channel), INT4 weight-only.

Each takes the prepared float model (``prepare``) and writes one file; they are plain
functions over paths so the mixed-precision search can call them again with exclusions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import numpy_helper
from onnxruntime.quantization import (
    CalibrationMethod as OrtCalibration,
)
from onnxruntime.quantization import (
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process

from turboinfer.optimize.builders.logs import quiet, scratch_cwd
from turboinfer.optimize.data.calibration import CALIBRATORS
from turboinfer.optimize.settings import ActivationType, CalibrationMethod

log = logging.getLogger(__name__)

# Ops that carry weights: without one of these there is nothing worth quantizing.
WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM",
                          "GRU", "RNN"})
# Dynamic quantization pays off on matrix products; ConvInteger is slower than FP32 Conv
# in ORT's CPU kernels, so convolutions are left to static quantization.
DYNAMIC_OPS = ("MatMul", "Gemm", "Attention")
# Weight-only INT4 is for models whose size is in MatMul weights (LLM-style blocks).
INT4_MIN_MATMUL_WEIGHTS = 1_000_000

_QUANT_TYPES = {ActivationType.UINT8: QuantType.QUInt8, ActivationType.INT8: QuantType.QInt8}


@dataclass(frozen=True)
class StaticQuant:
    """One static quantization: ranges from ``method`` (cached at ``ranges``)."""

    method: CalibrationMethod
    ranges: Path
    activation: ActivationType
    exclude: tuple[str, ...] = ()  # node names kept in float


def prepare(src: Path, dst: Path) -> Path:
    """Shape inference and basic fusions (Conv+BatchNorm) ORT recommends before quantizing,
    and a name on every node so layers can be excluded by name."""
    src, dst = src.resolve(), dst.resolve()
    try:
        with quiet(), scratch_cwd():
            quant_pre_process(str(src), str(dst))
    except Exception as exc:  # symbolic shape inference fails on some exported graphs
        log.info("symbolic shape inference failed (%s); using ONNX shape inference", exc)
        with quiet(), scratch_cwd():
            quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
    model = onnx.load(str(dst))
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
    onnx.save(model, str(dst))
    return dst


def weighted_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of nodes with weights, in graph (topological) order: the quantizable layers."""
    return [node.name for node in model.graph.node if node.op_type in WEIGHTED_OPS]


def quantize_int8_dynamic(base: Path, dst: Path) -> Path:
    """Int8 weights per output channel; activations quantized at run time.

    Per-channel weights cost ~8% of the speed-up on MiniLM here but lift its embeddings'
    cosine to FP32 from 0.968 to 0.994; products of two activations (attention scores)
    stay float, since their ranges change with every input.
    """
    with quiet():
        quantize_dynamic(str(base), str(dst), op_types_to_quantize=list(DYNAMIC_OPS),
                         per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"MatMulConstBOnly": True})
    return dst


def quantize_int8_static(base: Path, dst: Path, quant: StaticQuant) -> Path:
    """QDQ with per-channel signed weights; activations as ``quant.activation`` says."""
    ort_method: OrtCalibration = CALIBRATORS[quant.method].ort_method
    with quiet():
        quantize_static(
            str(base), str(dst), None,
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=_QUANT_TYPES[quant.activation],
            weight_type=QuantType.QInt8,
            nodes_to_exclude=list(quant.exclude),
            calibrate_method=ort_method,
            calibration_cache_path=str(quant.ranges),
        )
    return dst


def matmul_weight_elements(model: onnx.ModelProto) -> int:
    """Elements in constant 2-D MatMul weights: what INT4 weight-only can shrink."""
    weights = {init.name: init for init in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in weights:
            dims = weights[node.input[1]].dims
            if len(dims) == 2:
                total += int(dims[0]) * int(dims[1])
    return total


def quantize_int4(base: Path, dst: Path, block_size: int) -> Path:
    """Group-wise symmetric INT4 MatMul weights (``MatMulNBits``), INT8 compute."""
    # why: the MatMulNBits quantizer is heavy to import and only int4 uses it.
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(base)), block_size=block_size,
                                     is_symmetric=True, accuracy_level=4)
    with quiet():
        quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)
    return dst


def weight_bytes(model: onnx.ModelProto) -> int:
    return sum(numpy_helper.to_array(init).nbytes for init in model.graph.initializer)

