"""From a model reference to files on disk: pruned weights, ONNX, report.

This is what the ``prune`` command and ``tune --prune`` call. Outputs, in ``out_dir``:

- ``pruned.pt``: the whole pruned module (``torch.load(path, weights_only=False)``), ready
  for further fine-tuning; a plain state_dict would not fit the original class's widths.
- ``model.onnx``: its export with the entry's names and dynamic axes, for ``optimize``.
- ``structured.onnx``: with 2:4 only, the same widths without the 2:4 zeros (the baseline
  that shows what 2:4 does to latency here).
- ``report.json``: ``PruneReport.to_dict()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import orjson
import torch
from torch import nn

from turboinfer.errors import ConfigError
from turboinfer.hardware import profile
from turboinfer.models import builtin_onnx, resolve_model
from turboinfer.models.export import export_onnx
from turboinfer.models.zoo import ZooEntry
from turboinfer.prune.api import prune
from turboinfer.prune.measure import LatencySettings, onnx_latency
from turboinfer.prune.report import PruneReport, settings_dict
from turboinfer.prune.requires import torch_pruning
from turboinfer.prune.settings import PruneSettings
from turboinfer.prune.zoo import task_for


@dataclass(frozen=True)
class PrunedModel:
    """What ``tune`` needs: the file to quantize next, its metric, and the report."""

    onnx_path: Path
    metric_name: str
    metric: float | None  # after distillation (higher is better)
    metric_before: float | None  # the unpruned model, measured the same way
    report_path: Path


def prune_builtin(
    ref: str,
    settings: PruneSettings,
    out_dir: Path,
    *,
    train_path: Path | None = None,
    latency: LatencySettings | None = None,
) -> PruneReport:
    """Prune ``builtin:NAME``, write the outputs to ``out_dir`` and return the report."""
    entry = _entry(ref)
    torch_pruning()  # the prune extra, before the training data is built
    task = task_for(entry, train_path=train_path, batch_size=settings.batch_size,
                    seed=settings.seed)
    settings = dataclasses.replace(
        settings, distill=dataclasses.replace(settings.distill, objective=task.objective)
    )
    torch.manual_seed(settings.seed)
    result = prune(_build(entry), task.example_inputs, task.train_data, task.eval_fn, settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _write_models(entry, result.model, result.dense_model, out_dir)
    timed = {"original": builtin_onnx(entry), "pruned": files["onnx"]}
    if "structured_onnx" in files:
        timed["structured"] = files["structured_onnx"]
    lat = latency or LatencySettings()
    feeds = entry.example_inputs(lat.batch_size)
    report = PruneReport(
        model=entry.name,
        metric_name=entry.metric.name,
        settings=settings_dict(settings),
        result=result,
        latency=onnx_latency(timed, feeds, lat),
        files={k: str(v) for k, v in files.items()} | {"report": str(out_dir / "report.json")},
        machine=_machine(),
    )
    (out_dir / "report.json").write_bytes(
        orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    return report


def prune_for_tune(
    ref: str, settings: PruneSettings, out_dir: Path, *, latency: LatencySettings | None = None
) -> PrunedModel:
    """Prune for ``tune``: the ONNX file is one more candidate to quantize and time.

    The metric is the entry's own (the one ``tune``'s accuracy budget is stated in), so
    ``metric_before - metric`` is what pruning spent of the budget.
    """
    report = prune_builtin(ref, settings, out_dir, latency=latency)
    metrics = report.result.metrics
    return PrunedModel(
        onnx_path=Path(report.files["onnx"]),
        metric_name=report.metric_name,
        metric=metrics.distilled,
        metric_before=metrics.before,
        report_path=Path(report.files["report"]),
    )


def _entry(ref: str) -> ZooEntry:
    model = resolve_model(ref)
    if model.entry is None:
        raise ConfigError(
            f"pruning needs the PyTorch model, and {ref} is an ONNX file: use builtin:NAME, "
            "or call turboinfer.prune.prune() on your torch.nn.Module"
        )
    return model.entry


def _build(entry: ZooEntry) -> nn.Module:
    module = entry.build()
    if not isinstance(module, nn.Module):
        raise ConfigError(f"builtin {entry.name} did not build a torch.nn.Module")
    return module


def _write_models(
    entry: ZooEntry, model: nn.Module, dense: nn.Module | None, out_dir: Path
) -> dict[str, Path]:
    files = {"pytorch": out_dir / "pruned.pt",
             "onnx": _export(entry, model, out_dir / "model.onnx")}
    torch.save(model, files["pytorch"])
    if dense is not None:
        files["structured_onnx"] = _export(entry, dense, out_dir / "structured.onnx")
    return files


def _export(entry: ZooEntry, model: nn.Module, path: Path) -> Path:
    return export_onnx(
        model,
        entry.example_inputs(2),
        path,
        input_names=entry.input_names,
        output_names=entry.output_names,
        dynamic_axes=entry.dynamic_axes,
    )


def _machine() -> dict[str, object]:
    return dict(profile().summary())
