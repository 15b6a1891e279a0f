"""The registry of variant builders: one function per variant, each writing its files.

A builder only builds (and says why it skipped); judging the files is the pipeline's job,
so every variant is measured the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from turboinfer.engines.base import TensorSpec
from turboinfer.optimize.calibration import CALIBRATORS, CalibrationSet, compute_ranges
from turboinfer.optimize.fp16 import convert_fp16
from turboinfer.optimize.graph import optimize_graph
from turboinfer.optimize.measure import Judge
from turboinfer.optimize.quantize import (
    INT4_MIN_MATMUL_WEIGHTS,
    StaticQuant,
    matmul_weight_elements,
    quantize_int4,
    quantize_int8_dynamic,
    quantize_int8_static,
)
from turboinfer.optimize.report import ActivationDecision, Built
from turboinfer.optimize.settings import CalibrationMethod, OptimizeSettings, Variant

log = logging.getLogger(__name__)

NOTHING_TO_QUANTIZE = "nothing to quantize: the model has no Conv, MatMul, Gemm or RNN layer"


@dataclass(frozen=True)
class Context:
    """Everything a builder may read. ``base`` is the float model prepared for quantizing."""

    source: Path
    base: Path
    out: Path
    work: Path
    settings: OptimizeSettings
    judge: Judge
    specs: list[TensorSpec]
    layers: tuple[str, ...]  # weighted nodes of ``base``, graph order
    calib: CalibrationSet | None = None
    activation: ActivationDecision | None = None
    fast_fp16: bool = False

    def ranges(self, method: CalibrationMethod) -> Path:
        """The cached ranges of ``method``, computed on first use."""
        cache = self.work / f"ranges-{method.value}.json"
        if not cache.is_file():
            if self.calib is None:
                raise RuntimeError("static quantization without calibration data")
            compute_ranges(self.base, self.calib, method, self.settings, self.specs, cache)
        return cache

    def static(self, method: CalibrationMethod, dst: Path,
               exclude: tuple[str, ...] = ()) -> Path:
        if self.activation is None:
            raise RuntimeError("static quantization before the activation type is decided")
        quant = StaticQuant(method, self.ranges(method), self.activation.chosen, exclude)
        return quantize_int8_static(self.base, dst, quant)


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
}
