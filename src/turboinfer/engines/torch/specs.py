"""Input and output specs of a torch model, read from its ONNX export: feeds and results
are named and shaped as ONNX Runtime's for the same model, so engines interchange."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ModelLoadError

_ONNX_TO_NUMPY = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.BOOL: np.bool_,
}


def _specs(values: Any) -> list[TensorSpec]:
    specs = []
    for value in values:
        tensor_type = value.type.tensor_type
        shape = tuple(
            dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
            for dim in tensor_type.shape.dim
        )
        dtype = np.dtype(_ONNX_TO_NUMPY.get(tensor_type.elem_type, np.float32))
        specs.append(TensorSpec(value.name, dtype, shape))
    return specs


def read_specs(onnx_path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs) of the export; initializers listed as inputs are left out."""
    try:
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception as exc:
        raise ModelLoadError(f"cannot read {onnx_path}: {exc}") from None
    initializers = {init.name for init in graph.initializer}
    return _specs(v for v in graph.input if v.name not in initializers), _specs(graph.output)
