"""Export a ``torch.nn.Module`` to an ONNX file that accepts any size on its dynamic axes.

torch's default exporter (``torch.export`` + onnxscript) is used with ``dynamic_shapes``
built from the familiar ``dynamic_axes`` mapping: axes that share a name share one
symbolic dimension (``input_ids`` and ``attention_mask`` have one ``batch``), and the
names appear as ``dim_param`` in the file.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch

from turboinfer.errors import ConfigError
from turboinfer.models.cache import atomic_path

# protobuf cannot serialize a message past 2 GiB; bigger models keep weights beside the file.
_SINGLE_FILE_LIMIT = 1_800_000_000

ExampleInput = np.ndarray | torch.Tensor


def export_onnx(
    module: torch.nn.Module,
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
    module = module.eval()
    missing = [name for name in input_names if name not in example_inputs]
    if missing:
        raise ConfigError(f"example inputs lack {', '.join(missing)} needed to export {path}")
    args = tuple(_widened(name, example_inputs[name], dynamic_axes) for name in input_names)
    shapes = _dynamic_shapes(input_names, dynamic_axes)
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            module,
            args,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=shapes,
            opset_version=opset,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    if program is None:
        raise ConfigError(f"torch.onnx.export returned no program for {path}")
    _save(program.model_proto, path)
    return path


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


def _save(model: onnx.ModelProto, path: Path) -> None:
    big = model.ByteSize() > _SINGLE_FILE_LIMIT
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
