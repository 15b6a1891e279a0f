"""A user's model source → a checked ONNX file, written where asked or kept in the cache.

``export_model`` is what ``turboinfer export`` runs: load the source, export it with
dynamic axes, compare the file with the source in ONNX Runtime. ``cached_source`` does
the same on the fly for the other commands, keyed by a digest of the source (its files,
its weights) and the export options, like the zoo's exports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ModelLoadError, TurboinferError, UnknownModelError
from turboinfer.models.cache import cache_dir
from turboinfer.models.check import DEFAULT_ATOL, CheckResult, check_export
from turboinfer.models.export import export_onnx, needs_external_data, weight_bytes
from turboinfer.models.hf import load_hf_source
from turboinfer.models.onnx_file import check_onnx, input_specs, output_specs
from turboinfer.models.refs import is_factory, is_hf_folder, is_torch_file
from turboinfer.models.sources import InputSpec, TorchSource, load_torch_source, one_line


@dataclass(frozen=True)
class ExportOptions:
    """How to export: the HF task, example inputs, the check's tolerance, the opset."""

    task: str | None = None
    example_inputs: tuple[InputSpec, ...] = ()
    atol: float = DEFAULT_ATOL
    opset: int = 18

    def key(self) -> tuple[str, ...]:
        specs = ",".join(f"{s.name}={s.shape}:{s.dtype}" for s in self.example_inputs)
        return (str(self.task), specs, str(self.opset), torch.__version__)


@dataclass(frozen=True)
class ExportReport:
    """What was written and how closely it matches the source."""

    source: str
    path: Path
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    checks: list[CheckResult] = field(default_factory=list)
    external_data: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "path": str(self.path),
            "inputs": [spec.to_dict() for spec in self.inputs],
            "outputs": [spec.to_dict() for spec in self.outputs],
            "external_data": self.external_data,
            "checks": [check.to_dict() for check in self.checks],
        }


def load_source(ref: str, options: ExportOptions) -> TorchSource:
    """The torch model a reference names: a factory, a torch file, or an HF folder."""
    if is_hf_folder(ref):
        return load_hf_source(Path(ref).expanduser(), options.task)
    if is_factory(ref) or is_torch_file(ref):
        return load_torch_source(ref, options.example_inputs)
    if Path(ref).expanduser().is_dir():
        raise UnknownModelError(f"{ref} is a folder without config.json: not a Hugging Face model")
    raise UnknownModelError(
        f"cannot export {ref!r}: use package.module:factory, a TorchScript .pt or torch.export "
        ".pt2 file, or a Hugging Face model folder"
    )


def export_model(ref: str, out: Path, options: ExportOptions | None = None) -> ExportReport:
    """Export ``ref`` to ``out`` and check it; a file that fails the check is removed."""
    options = options or ExportOptions()
    source = load_source(ref, options)
    checks = _export_checked(source, Path(out), options)
    model = check_onnx(Path(out))
    return ExportReport(ref, Path(out), input_specs(model), output_specs(model), checks,
                        needs_external_data(weight_bytes(source.module)))


def cached_source(
    ref: str, options: ExportOptions | None = None
) -> tuple[str, Path, Callable[[], torch.nn.Module]]:
    """Name, cached checked ONNX export, and module factory of a source (exported once)."""
    options = options or ExportOptions()
    source = load_source(ref, options)
    parts = (*source.fingerprint, *options.key())
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
    path = cache_dir() / "onnx" / f"{source.name}-{key}.onnx"
    try:
        check_onnx(path)
    except TurboinferError:
        _export_checked(source, path, options)
    runnable = source.runnable
    return source.name, path, lambda: runnable


def _export_checked(source: TorchSource, path: Path, options: ExportOptions) -> list[CheckResult]:
    try:
        export_onnx(source.module, source.examples, path, input_names=source.input_names,
                    output_names=source.output_names, dynamic_axes=source.dynamic_axes,
                    opset=options.opset)
    except TurboinferError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"exporting {source.name} to ONNX failed: {root_cause(exc)}; rewrite that part "
            "of the model with supported ops, or try another --opset"
        ) from None
    try:
        return check_export(source, path, options.atol)
    except TurboinferError:
        path.unlink(missing_ok=True)
        path.with_name(f"{path.name}.data").unlink(missing_ok=True)
        raise


def root_cause(exc: BaseException) -> str:
    """The innermost cause's first line: the exporter wraps the error that names the op."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return one_line(exc)
