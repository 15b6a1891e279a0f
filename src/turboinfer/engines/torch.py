"""PyTorch eager adapter: runs the original ``nn.Module`` (the baseline to beat).

Input and output names come from the model's ONNX export, so feeds and results are
interchangeable with the other engines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch

from turboinfer.engines.base import (
    EngineSettings,
    Feeds,
    ModelArtifact,
    SpecsSession,
    TensorSpec,
    check_feeds,
)
from turboinfer.errors import ConfigError, InvalidInputError, ModelLoadError

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


class TorchSession(SpecsSession):
    def __init__(self, module: torch.nn.Module, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], device: torch.device) -> None:
        super().__init__(inputs, outputs)
        self.module = module
        self.device = device

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        try:
            args = [torch.from_numpy(np.asarray(feeds[spec.name])).to(self.device)
                    for spec in self._inputs]
            with torch.inference_mode():
                result = self.module(*args)
        except (KeyError, RuntimeError, TypeError, ValueError) as exc:
            check_feeds(self._inputs, feeds)
            raise InvalidInputError(f"torch could not run the inputs: {exc}") from None
        values = result if isinstance(result, tuple | list) else (result,)
        return {
            spec.name: value.detach().cpu().numpy()
            for spec, value in zip(self._outputs, values, strict=False)
        }


class TorchEngine:
    name = "torch"

    def load(self, model: ModelArtifact, settings: EngineSettings) -> TorchSession:
        if model.torch_module is None:
            raise ConfigError(
                f"the torch engine needs the PyTorch module; {model.name} is only an ONNX file"
            )
        if settings.device != "cpu" and not torch.cuda.is_available():
            raise ConfigError(f"device {settings.device!r} needs a CUDA build of torch and a GPU")
        if settings.intra_op_threads:
            # Process-wide in torch: the last session loaded decides.
            torch.set_num_threads(settings.intra_op_threads)
        try:
            graph = onnx.load(str(model.onnx_path), load_external_data=False).graph
        except Exception as exc:
            raise ModelLoadError(f"cannot read {model.onnx_path}: {exc}") from None
        initializers = {init.name for init in graph.initializer}
        inputs = _specs(v for v in graph.input if v.name not in initializers)
        outputs = _specs(graph.output)
        factory: Callable[[], torch.nn.Module] = model.torch_module  # type: ignore[assignment]
        device = torch.device("cpu" if settings.device == "cpu" else "cuda")
        module = factory().eval().to(device)
        return TorchSession(module, inputs, outputs, device)


ENGINE = TorchEngine()
