"""OpenVINO adapter (optional extra ``openvino``): reads ONNX directly, or OpenVINO IR
(``.xml`` with its ``.bin`` beside, as NNCF variants are saved); CPU plugin."""

from __future__ import annotations

from typing import Any

import numpy as np
import openvino as ov

from turboinfer.engines.base import (
    EngineSettings,
    Feeds,
    ModelArtifact,
    SpecsSession,
    TensorSpec,
    check_feeds,
)
from turboinfer.errors import ConfigError, InvalidInputError, ModelLoadError, UnknownModelError


def _spec(port: Any) -> TensorSpec:
    shape = tuple(
        dim.get_length() if dim.is_static else None for dim in port.get_partial_shape()
    )
    dtype = np.dtype(port.get_element_type().to_dtype())
    return TensorSpec(port.get_any_name(), dtype, shape)


class OpenVinoSession(SpecsSession):
    def __init__(self, compiled: Any) -> None:
        super().__init__([_spec(port) for port in compiled.inputs],
                         [_spec(port) for port in compiled.outputs])
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self._output_ports = list(compiled.outputs)

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        # OpenVINO converts mismatched dtypes silently; the other engines refuse them.
        check_feeds(self._inputs, feeds)
        try:
            self.request.infer(dict(feeds))
        except Exception as exc:  # OpenVINO raises plain RuntimeErrors on bad inputs
            raise InvalidInputError(f"openvino could not run the inputs: {exc}") from None
        # The request reuses its output buffers on the next call: copy them out.
        return {
            spec.name: self.request.get_tensor(port).data.copy()
            for spec, port in zip(self._outputs, self._output_ports, strict=True)
        }


class OpenVinoEngine:
    name = "openvino"

    def load(self, model: ModelArtifact, settings: EngineSettings) -> OpenVinoSession:
        if settings.device != "cpu":
            raise ConfigError("the openvino engine runs on the CPU here; use device 'cpu'")
        settings.refuse_forms(self.name, set())
        if not model.onnx_path.is_file():
            raise UnknownModelError(f"model file not found: {model.onnx_path}")
        # f32 explicitly: the plugin may otherwise pick a lower precision on its own.
        config: dict[str, Any] = {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32",
        }
        if settings.intra_op_threads:
            config["INFERENCE_NUM_THREADS"] = settings.intra_op_threads
        try:
            core = ov.Core()
            compiled = core.compile_model(str(model.onnx_path), "CPU", config)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelLoadError(f"openvino cannot load {model.onnx_path}: {first}") from None
        return OpenVinoSession(compiled)


ENGINE = OpenVinoEngine()
