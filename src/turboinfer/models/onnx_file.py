"""Validate a user's ONNX file and describe its inputs and outputs.

The checks are the ones that turn an engine's long traceback into a one-line answer:
the file is missing, it is not an ONNX protobuf, or its external weights are not where
the model says. Operator-level checks are left to the engine, which knows its own
operator set (``onnx.checker`` rejects contrib ops that ONNX Runtime runs fine).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper, helper

from turboinfer.engines.base import Dim, TensorSpec
from turboinfer.errors import ModelLoadError, UnknownModelError


def check_onnx(path: Path, *, load_weights: bool = False) -> onnx.ModelProto:
    """Read and validate ``path``; return the model.

    External weights (a data file beside the ``.onnx``) are resolved against the model's
    folder: with ``load_weights`` they are read into the returned proto, otherwise each
    one is only checked to exist and be long enough, which keeps a multi-GB model cheap
    to inspect.
    """
    path = Path(path)
    if not path.exists():
        raise UnknownModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"cannot read ONNX model {path}: not a file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except DecodeError:
        raise ModelLoadError(
            f"cannot read ONNX model {path}: not a valid ONNX protobuf (corrupt or truncated)"
        ) from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read ONNX model {path}: {_one_line(exc)}") from None
    # An empty or foreign protobuf can parse "successfully" into an empty ModelProto.
    if model.ir_version <= 0 or not model.graph.output:
        raise ModelLoadError(f"cannot read ONNX model {path}: no ONNX graph in the file")
    _check_external_data(model, path)
    if load_weights:
        external_data_helper.load_external_data_for_model(model, str(path.parent))
    return model


def input_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """The graph inputs a caller must feed (initializers listed as inputs are skipped)."""
    weights = {init.name for init in model.graph.initializer}
    return [_spec(vi) for vi in model.graph.input if vi.name not in weights]


def output_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    return [_spec(vi) for vi in model.graph.output]


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    shape: tuple[Dim, ...] = tuple(_dim(d) for d in tensor_type.shape.dim)
    return TensorSpec(name=value.name, dtype=dtype, shape=shape)


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    if dim.HasField("dim_param"):
        return str(dim.dim_param)
    return None


def _check_external_data(model: onnx.ModelProto, path: Path) -> None:
    base = path.parent.resolve()
    for tensor in _tensors(model.graph):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        data = (base / info.location).resolve()
        where = f"cannot read ONNX model {path}: weight {tensor.name!r} lives in {data}"
        # Engines refuse data outside the model's folder; say so before they do.
        if not data.is_relative_to(base):
            raise ModelLoadError(f"{where}, outside the model's folder")
        if not data.is_file():
            raise ModelLoadError(f"{where}, which is missing")
        end = (info.offset or 0) + (info.length or 0)
        if data.stat().st_size < end:
            raise ModelLoadError(f"{where}, which is shorter than expected (truncated)")


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor that can hold weights: initializers and constants, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
