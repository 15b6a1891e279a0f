"""Export a torch model to an ONNX file that accepts any size on its dynamic axes.

An ``nn.Module`` goes through torch's default exporter (``torch.export`` + onnxscript)
with ``dynamic_shapes`` built from the familiar ``dynamic_axes`` mapping: axes that share
a name share one symbolic dimension (``input_ids`` and ``attention_mask`` have one
``batch``), and the names appear as ``dim_param`` in the file. A TorchScript module cannot
be traced by ``torch.export``, so it takes the TorchScript-based exporter, which reads
the same ``dynamic_axes``. A ``torch.export`` program already carries its symbolic shapes
(re-exporting its module would pin them); it is converted as it is and its batch symbol
renamed ``batch``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import torch

from turboinfer.errors import ConfigError
from turboinfer.models.cache import atomic_path

# One export at a time in a process: torch.export keeps its dispatch modes on one
# process-wide stack (and _quiet swaps process-wide warning and logging settings), so two
# models exported from two threads at once (a server loading its zoo) failed with "Trying
# to pop empty mode stack" or hung.
_EXPORT_LOCK = threading.Lock()

# protobuf cannot serialize a message past 2 GiB; bigger models keep weights beside the file.
_SINGLE_FILE_LIMIT = 1_800_000_000

ExampleInput = np.ndarray | torch.Tensor
# What can be exported: a module, a TorchScript module, or a program from torch.export.
Exportable = torch.nn.Module | torch.jit.ScriptModule | torch.export.ExportedProgram


def needs_external_data(weight_bytes: int) -> bool:
    """Whether weights of this size must live in a data file beside the ``.onnx``."""
    return weight_bytes > _SINGLE_FILE_LIMIT


def weight_bytes(model: Exportable) -> int:
    """Bytes of parameters and buffers: what the ONNX file will hold as initializers."""
    # A program holds its weights as a dict attribute; modules build one on request.
    state: Mapping[str, object] = (
        model.state_dict if isinstance(model, torch.export.ExportedProgram)
        else model.state_dict()
    )
    return sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))


def export_onnx(
    module: Exportable,
    example_inputs: Mapping[str, ExampleInput],
    path: Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    opset: int = 18,
) -> Path:
    """Export ``module`` called as ``module(*inputs in input_names order)`` to ``path``.

    The file appears atomically. Small models are one self-contained file; models past
    protobuf's 2 GiB limit get their weights in ``<name>.data`` beside it.
    """
    path = Path(path)
    missing = [name for name in input_names if name not in example_inputs]
    if missing:
        raise ConfigError(f"example inputs lack {', '.join(missing)} needed to export {path}")
    args = tuple(_widened(name, example_inputs[name], dynamic_axes) for name in input_names)
    big = needs_external_data(weight_bytes(module))
    with _EXPORT_LOCK:
        if isinstance(module, torch.jit.ScriptModule):
            proto = _export_script(module, args, input_names, output_names, dynamic_axes,
                                   opset)
            _save_proto(proto, path, big)
        else:
            _save_program(_export_dynamo(module, args, input_names, output_names,
                                         dynamic_axes, opset), path, big)
    return path


def _export_dynamo(
    module: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    opset: int,
) -> torch.onnx.ONNXProgram:
    program_given = isinstance(module, torch.export.ExportedProgram)
    if isinstance(module, torch.nn.Module):
        module = module.eval()
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            module,
            args,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=None if program_given else _dynamic_shapes(input_names, dynamic_axes),
            opset_version=opset,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    if program is None:
        raise ConfigError("torch.onnx.export returned no program")
    if program_given:
        _name_batch_axis(program.model.graph)
    return program


def _export_script(
    module: torch.jit.ScriptModule,
    args: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    opset: int,
) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as folder, _quiet(), torch.no_grad():
        staged = Path(folder) / "model.onnx"
        torch.onnx.export(
            module, args, str(staged), input_names=list(input_names),
            output_names=list(output_names), opset_version=opset, dynamo=False,
            dynamic_axes={name: dict(axes) for name, axes in dynamic_axes.items()},
        )
        return onnx.load(str(staged))


def _name_batch_axis(graph: ir.Graph) -> None:
    """Call the first input's leading symbol ``batch`` wherever it appears at the edges."""
    first = graph.inputs[0].shape if graph.inputs else None
    if first is None or not first or not isinstance(first[0], ir.SymbolicDim):
        return
    symbol = first[0].value
    for value in (*graph.inputs, *graph.outputs):
        if value.shape is not None:
            value.shape = ir.Shape(
                [ir.SymbolicDim("batch") if isinstance(d, ir.SymbolicDim) and d.value == symbol
                 else d for d in value.shape]
            )


def _widened(
    name: str, value: ExampleInput, dynamic_axes: Mapping[str, Mapping[int, str]]
) -> torch.Tensor:
    """The example as a tensor, grown to size 2 on each dynamic axis of size 1.

    ``torch.export`` specializes dimensions whose example size is 0 or 1, which would fix
    the batch at 1 in the exported graph; repeating the sample keeps the axis symbolic.
    """
    tensor = torch.as_tensor(np.asarray(value)) if isinstance(value, np.ndarray) else value
    for axis in dynamic_axes.get(name, {}):
        if tensor.shape[axis] == 1:
            tensor = torch.cat([tensor, tensor], dim=axis)
    return tensor


def _dynamic_shapes(
    input_names: Sequence[str], dynamic_axes: Mapping[str, Mapping[int, str]]
) -> tuple[dict[int, torch.export.Dim], ...]:
    dims: dict[str, torch.export.Dim] = {}
    shapes = []
    for name in input_names:
        axes = dynamic_axes.get(name, {})
        shapes.append(
            {axis: dims.setdefault(label, torch.export.Dim(label)) for axis, label in axes.items()}
        )
    return tuple(shapes)


def _save_program(program: torch.onnx.ONNXProgram, path: Path, big: bool) -> None:
    if not big:
        _save_proto(program.model_proto, path, big=False)
        return
    # Past 2 GiB there is no proto to hold the model: the program writes the file and its
    # data in a staging folder beside the target, under the final names (the file records
    # the data file's name); the data moves first so the model appears last.
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as folder:
        staged = Path(folder) / path.name
        program.save(staged, external_data=True)
        for file in sorted(Path(folder).iterdir(), key=lambda f: f == staged):
            os.replace(file, path.parent / file.name)


def _save_proto(model: onnx.ModelProto, path: Path, big: bool) -> None:
    with atomic_path(path) as tmp:
        if big:
            # The data file is written under its final name (the proto records it); only
            # the .onnx that points at it is renamed into place, so it appears last.
            onnx.save_model(
                model,
                str(tmp),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=f"{path.name}.data",
            )
        else:
            onnx.save_model(model, str(tmp))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporter: stdout belongs to the CLI's --json output.

    The exporter prints progress lines, logs missing optional libraries and warns about
    deprecations; none of it is actionable for someone exporting a model.
    """
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
