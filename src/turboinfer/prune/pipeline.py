"""From a model reference to files on disk: pruned weights, ONNX, report.

This is what the ``prune`` command and ``tune --prune`` call, for a built-in or the
user's own PyTorch source (``prune/target.py`` says which). Outputs, in ``out_dir``:

- ``pruned.pt``: the whole pruned module (``torch.load(path, weights_only=False)``), ready
  for further fine-tuning; a plain state_dict would not fit the original class's widths.
- ``model.onnx``: its export with the source's names and dynamic axes, for ``optimize``.
- ``structured.onnx``: with 2:4 only, the same widths without the 2:4 zeros (the baseline
  that shows what 2:4 does to latency here).
- ``report.json``: ``PruneReport.to_dict()``.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson
import torch
from torch import nn

from turboinfer.hardware import profile
from turboinfer.models.export import export_onnx
from turboinfer.prune.api import prune
from turboinfer.prune.measure import LatencySettings, onnx_latency
from turboinfer.prune.report import Budget, PruneReport, settings_dict
from turboinfer.prune.requires import torch_pruning
from turboinfer.prune.settings import PruneSettings
from turboinfer.prune.sources import prune_target
from turboinfer.prune.target import PruneTarget


@dataclass(frozen=True)
class PrunedModel:
    """What ``tune`` needs: the file to quantize next, its metric, and the report."""

    onnx_path: Path
    metric_name: str
    metric: float | None  # after distillation (higher is better)
    metric_before: float | None  # the unpruned model, measured the same way
    report_path: Path


def prune_model(
    ref: str,
    settings: PruneSettings,
    out_dir: Path,
    *,
    train_path: Path | None = None,
    eval_path: Path | None = None,
    latency: LatencySettings | None = None,
    max_drop: float | None = None,
) -> PruneReport:
    """Prune ``ref``, write the outputs to ``out_dir`` and return the report.

    ``max_drop`` is the budget: how far the metric may fall from the unpruned model's,
    in the metric's own unit; the report says whether the pruned model kept it.
    """
    torch_pruning()  # the prune extra, before the training data is built
    target = prune_target(ref, train_path=train_path, eval_path=eval_path,
                          batch_size=settings.batch_size, seed=settings.seed)
    settings = dataclasses.replace(
        settings, distill=dataclasses.replace(settings.distill, objective=target.objective)
    )
    torch.manual_seed(settings.seed)
    result = prune(target.module, target.example_inputs, target.train_data, target.eval_fn,
                   settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _write_models(target, result.model, result.dense_model, out_dir)
    lat = latency or LatencySettings()
    with tempfile.TemporaryDirectory() as tmp:
        original = target.original_onnx or _export(target, result.teacher,
                                                   Path(tmp) / "original.onnx")
        timed = {"original": original, "pruned": files["onnx"]}
        if "structured_onnx" in files:
            timed["structured"] = files["structured_onnx"]
        measured = onnx_latency(timed, target.latency_feeds(lat.batch_size), lat)
    metrics = result.metrics
    report = PruneReport(
        model=target.name,
        metric_name=target.metric_name,
        settings=settings_dict(settings),
        result=result,
        latency=measured,
        files={k: str(v) for k, v in files.items()} | {"report": str(out_dir / "report.json")},
        machine=_machine(),
        budget=Budget.of(max_drop, metrics.before, metrics.distilled),
    )
    (out_dir / "report.json").write_bytes(
        orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    return report


def prune_for_tune(
    ref: str, settings: PruneSettings, out_dir: Path, *, latency: LatencySettings | None = None
) -> PrunedModel:
    """Prune for ``tune``: the ONNX file is one more candidate to quantize and time.

    The metric is the target's own (for a built-in, the one ``tune``'s accuracy budget is
    stated in), so ``metric_before - metric`` is what pruning spent of the budget.
    """
    report = prune_model(ref, settings, out_dir, latency=latency)
    metrics = report.result.metrics
    return PrunedModel(
        onnx_path=Path(report.files["onnx"]),
        metric_name=report.metric_name,
        metric=metrics.distilled,
        metric_before=metrics.before,
        report_path=Path(report.files["report"]),
    )


def _write_models(
    target: PruneTarget, model: nn.Module, dense: nn.Module | None, out_dir: Path
) -> dict[str, Path]:
    files = {"pytorch": out_dir / "pruned.pt",
             "onnx": _export(target, model, out_dir / "model.onnx")}
    torch.save(target.exported(model), files["pytorch"])
    if dense is not None:
        files["structured_onnx"] = _export(target, dense, out_dir / "structured.onnx")
    return files


def _export(target: PruneTarget, model: nn.Module, path: Path) -> Path:
    signature = target.signature
    return export_onnx(
        target.exported(model).eval(),
        dict(zip(signature.input_names, target.export_examples(), strict=True)),
        path,
        input_names=signature.input_names,
        output_names=signature.output_names,
        dynamic_axes=signature.dynamic_axes,
    )


def _machine() -> dict[str, object]:
    return dict(profile().summary())
