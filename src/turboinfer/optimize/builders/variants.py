"""The registry of variant builders: one function per variant, each writing its files.

A builder only builds (and says why it skipped); every file is then judged the same way
(``measure.judge_built``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import onnx

from turboinfer.optimize.builders.context import Context
from turboinfer.optimize.builders.fp16 import convert_fp16
from turboinfer.optimize.builders.graph import optimize_graph
from turboinfer.optimize.builders.qat import build_qat
from turboinfer.optimize.builders.quantize import (
    INT4_MIN_MATMUL_WEIGHTS,
    matmul_weight_elements,
    quantize_int4,
    quantize_int8_dynamic,
)
from turboinfer.optimize.data.calibration import CALIBRATORS
from turboinfer.optimize.report import Built
from turboinfer.optimize.settings import Variant

log = logging.getLogger(__name__)

NOTHING_TO_QUANTIZE = "nothing to quantize: the model has no Conv, MatMul, Gemm or RNN layer"

Builder = Callable[[Context], list[Built]]


def build_graph(ctx: Context) -> list[Built]:
    result = optimize_graph(ctx.source, ctx.out / "graph.onnx", ctx.work)
    return [Built("graph", Variant.GRAPH, ctx.out / "graph.onnx", details=result.to_dict())]


def build_fp16(ctx: Context) -> list[Built]:
    path = convert_fp16(ctx.base, ctx.out / "fp16.onnx")
    note = ("this machine has fast FP16 compute" if ctx.fast_fp16 else
            "no fast FP16 on this machine: engines compute in FP32 here, the latency shows "
            "the cost of the conversions")
    return [Built("fp16", Variant.FP16, path, details={"fast_fp16": ctx.fast_fp16,
                                                       "note": note})]


def build_int8_dynamic(ctx: Context) -> list[Built]:
    if not ctx.layers:
        return [Built("int8-dynamic", Variant.INT8_DYNAMIC, skipped=NOTHING_TO_QUANTIZE)]
    path = quantize_int8_dynamic(ctx.base, ctx.out / "int8-dynamic.onnx")
    return [Built("int8-dynamic", Variant.INT8_DYNAMIC, path)]


def build_int8_static(ctx: Context) -> list[Built]:
    if not ctx.layers:
        return [Built("int8-static", Variant.INT8_STATIC, skipped=NOTHING_TO_QUANTIZE)]
    built = []
    for method in ctx.settings.calibrations:
        name = f"int8-static-{method.value}"
        path = ctx.static(method, ctx.out / f"{name}.onnx")
        details = {"method": CALIBRATORS[method].describe(ctx.settings),
                   "activation_type": ctx.activation.chosen.value if ctx.activation else None}
        built.append(Built(name, Variant.INT8_STATIC, path, calibration=method,
                           details=details))
    return built


def build_int4(ctx: Context) -> list[Built]:
    if not ctx.layers:
        return [Built("int4", Variant.INT4, skipped=NOTHING_TO_QUANTIZE)]
    model = onnx.load(str(ctx.base), load_external_data=False)
    elements = matmul_weight_elements(model)
    if elements < INT4_MIN_MATMUL_WEIGHTS:
        reason = (f"no large MatMul weights ({elements:,} elements, fewer than "
                  f"{INT4_MIN_MATMUL_WEIGHTS:,}): int4 weight-only is for LLM-style models")
        return [Built("int4", Variant.INT4, skipped=reason)]
    block = ctx.settings.int4_block_size
    path = quantize_int4(ctx.base, ctx.out / "int4.onnx", block)
    return [Built("int4", Variant.INT4, path,
                  details={"block_size": block, "matmul_weight_elements": elements})]


BUILDERS: dict[Variant, Builder] = {
    Variant.GRAPH: build_graph,
    Variant.FP16: build_fp16,
    Variant.INT8_DYNAMIC: build_int8_dynamic,
    Variant.INT8_STATIC: build_int8_static,
    Variant.INT4: build_int4,
    Variant.QAT: build_qat,
}
