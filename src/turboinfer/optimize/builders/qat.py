"""The ``qat`` variant: fine-tune the PyTorch model with fake INT8, then quantize it.

The model is trained as ONNX Runtime's static quantizer will run it (``turboinfer.qat``),
exported with its learned activation ranges as clamps, prepared like the float model,
and quantized by the same quantizer as ``int8-static`` with MinMax ranges (which read
those clamps), so the result is a plain QDQ model every engine here runs.

Training data, in order: ``--train-data`` (inputs by name, with ``labels`` for a
supervised loss), a built-in's own training split, or the calibration samples (then
the float model's outputs are the only target).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from turboinfer.errors import ConfigError
from turboinfer.models.export import export_onnx
from turboinfer.optimize.builders.context import Context
from turboinfer.optimize.builders.quantize import prepare
from turboinfer.optimize.report import Built
from turboinfer.optimize.settings import CalibrationMethod, Variant
from turboinfer.prune.data import LABELS_KEY, TrainData
from turboinfer.prune.settings import Objective
from turboinfer.prune.sources import read_arrays
from turboinfer.prune.zoo import TRAIN_DATA
from turboinfer.qat.train import QATSettings, qat_finetune

NO_TORCH = ("QAT needs the PyTorch model: give builtin:NAME, package.module:factory or a "
            "Hugging Face folder instead of an ONNX file")
BATCH = 64


def build_qat(ctx: Context) -> list[Built]:
    if not callable(ctx.torch_module):
        return [Built("qat", Variant.QAT, skipped=NO_TORCH)]
    if not ctx.layers:
        return [Built("qat", Variant.QAT, skipped="nothing to quantize")]
    module = ctx.torch_module()
    if not isinstance(module, nn.Module):
        return [Built("qat", Variant.QAT, skipped=NO_TORCH)]
    names = tuple(spec.name for spec in ctx.specs)
    data, source = _train_data(ctx, names)
    first = next(iter(data))[0]
    with torch.no_grad():
        output = module.eval()(*first)
    logits = isinstance(output, torch.Tensor) and output.ndim == 2 and output.shape[1] >= 2
    settings = QATSettings(epochs=ctx.settings.qat_epochs, seed=0,
                           minutes=ctx.settings.qat_minutes,
                           objective=Objective.LOGITS if logits else Objective.EMBEDDING)
    started = time.perf_counter()
    result = qat_finetune(module, data, settings)
    seconds = time.perf_counter() - started
    trained = _export(ctx, result.model, first, ctx.work / "qat-fp32.onnx")
    base = prepare(trained, ctx.work / "qat-base.onnx")
    path = ctx.static(CalibrationMethod.MINMAX, ctx.out / "qat.onnx", base=base)
    details = {"training_data": source, "epochs": settings.epochs, "lr": settings.lr,
               "epochs_run": len(result.losses), "minutes": settings.minutes,
               "train_seconds": round(seconds, 1),
               "loss_per_epoch": [round(x, 4) for x in result.losses],
               "ranges_trained": len(result.ranges_after),
               "activation_type": ctx.activation.chosen.value if ctx.activation else None}
    return [Built("qat", Variant.QAT, path, calibration=CalibrationMethod.MINMAX,
                  details=details)]


def _train_data(ctx: Context, names: tuple[str, ...]) -> tuple[TrainData, str]:
    if ctx.settings.train_data is not None:
        arrays = read_arrays(ctx.settings.train_data, "training")
        missing = [n for n in names if n not in arrays]
        if missing:
            raise ConfigError(f"--train-data {ctx.settings.train_data} lacks input "
                              f"{', '.join(missing)} (it has {', '.join(sorted(arrays))})")
        return (TrainData({n: arrays[n] for n in names}, arrays.get(LABELS_KEY),
                          batch_size=BATCH), f"--train-data {ctx.settings.train_data}")
    if ctx.entry is not None and ctx.entry.name in TRAIN_DATA:
        return TRAIN_DATA[ctx.entry.name](None, BATCH, 0), f"{ctx.entry.name}'s training split"
    if ctx.calib is None:
        raise ConfigError("QAT needs training data: --train-data FILE.npz, or calibration data")
    return (TrainData({n: ctx.calib.feeds[n] for n in names}, None, batch_size=BATCH),
            "calibration samples, distilled from the float model")


def _export(ctx: Context, model: nn.Module, first: tuple[torch.Tensor, ...], path: Path) -> Path:
    """The trained model under the source file's input and output names and dynamic axes."""
    graph = onnx.load(str(ctx.source), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    values = [v for v in graph.input if v.name not in inits] + list(graph.output)
    axes: dict[str, Mapping[int, str]] = {
        v.name: {i: d.dim_param for i, d in enumerate(v.type.tensor_type.shape.dim)
                 if d.dim_param} for v in values}
    examples = {spec.name: np.ascontiguousarray(t[:2].numpy())
                for spec, t in zip(ctx.specs, first, strict=True)}
    return export_onnx(model, examples, path, input_names=[s.name for s in ctx.specs],
                       output_names=[v.name for v in graph.output],
                       dynamic_axes={k: v for k, v in axes.items() if v})
