"""Per-layer sensitivity: where quantization noise enters, from ORT's ``qdq_loss_debug``.

Both models are run on calibration samples with every activation saved. For each tensor
the library gives the SQNR of the quantized model against the float one (``xmodel``).
A layer's cost is the SQNR lost across it: SQNR at its input minus SQNR at its output,
which charges the layer for its own weight and activation quantization and not for the
noise it inherited, so deep layers are not ranked first merely for being deep.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization.qdq_loss_debug import (
    collect_activations,
    compute_activation_error,
    create_activation_matching,
    modify_model_output_intermediate_tensors,
)

from turboinfer.optimize.builders.context import Context
from turboinfer.optimize.builders.quantize import WEIGHTED_OPS
from turboinfer.optimize.data.calibration import FeedReader, run_batch
from turboinfer.optimize.report import LayerSensitivity, OptimizeReport

# Samples to compare on: SQNR settles within a few batches, and every activation of both
# models is held in memory for all of them.
SAMPLES = 16
# SQNR assumed where a tensor is not quantized (a graph input): above any real value.
CLEAN_DB = 60.0
# Activations ORT's QDQ quantizer may fold into the layer before them.
_FOLDED = ("Relu", "Clip")


def layer_sensitivity(float_path: Path, qdq_path: Path, feeds: dict[str, Any],
                      batch: int, work: Path) -> list[LayerSensitivity]:
    """Weighted layers ranked by SQNR lost, most sensitive first (unknown ones last)."""
    sqnr = tensor_sqnr(float_path, qdq_path, feeds, batch, work)
    model = onnx.load(str(float_path), load_external_data=False)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    layers = [_layer(node, sqnr, consumers) for node in model.graph.node
              if node.op_type in WEIGHTED_OPS]
    return sorted(layers, key=lambda s: -math.inf if s.loss_db is None else s.loss_db,
                  reverse=True)


def tensor_sqnr(float_path: Path, qdq_path: Path, feeds: dict[str, Any], batch: int,
                work: Path) -> dict[str, float]:
    """SQNR in dB of the quantized model against the float one, per activation tensor."""
    activations = []
    for label, path in (("float", float_path), ("qdq", qdq_path)):
        augmented = work / f"sensitivity-{label}.onnx"
        modify_model_output_intermediate_tensors(str(path), str(augmented))
        activations.append(collect_activations(str(augmented), FeedReader(feeds, batch)))
        augmented.unlink()
    float_acts, qdq_acts = activations
    matching = create_activation_matching(qdq_acts, float_acts)
    errors = compute_activation_error(matching)
    return {name: err["xmodel_err"] for name, err in errors.items() if "xmodel_err" in err}


def _layer(node: onnx.NodeProto, sqnr: dict[str, float],
           consumers: dict[str, list[onnx.NodeProto]]) -> LayerSensitivity:
    tensor = node.output[0]
    if tensor not in sqnr:
        after = consumers.get(tensor, [])
        if len(after) == 1 and after[0].op_type in _FOLDED:
            tensor = after[0].output[0]
    out = sqnr.get(tensor)
    if out is None:
        return LayerSensitivity(node.name, node.op_type, tensor, None, None)
    before = min(CLEAN_DB, sqnr.get(node.input[0], CLEAN_DB))
    return LayerSensitivity(node.name, node.op_type, tensor, out, max(0.0, before - out))


def add_sensitivity(report: OptimizeReport, ctx: Context) -> OptimizeReport:
    """Rank the layers of the best-calibrated static model against the float model."""
    best = report.best_static()
    if best is None or best.path is None:
        return report.with_notes("sensitivity: no int8-static model to compare")
    if ctx.calib is None:
        return report.with_notes("sensitivity: no calibration data to compare on")
    feeds = ctx.calib.slice(0, SAMPLES)
    ranking = layer_sensitivity(ctx.base, best.path, feeds, run_batch(ctx.specs), ctx.work)
    return replace(report, sensitivity=tuple(ranking))
