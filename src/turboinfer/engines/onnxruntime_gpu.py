"""ONNX Runtime on an NVIDIA GPU: the CUDA and TensorRT execution providers with their
options, and a session that keeps its tensors on the device through I/O binding.

The providers come with the ``onnxruntime-gpu`` package (the ``gpu`` extra); the plain
``onnxruntime`` wheel has the CPU provider only, and asking it for a GPU is a ConfigError
that names the extra. With ``cuda_graphs`` ONNX Runtime captures the whole run once and
replays it (``enable_cuda_graph`` / ``trt_cuda_graph_enable``); it needs the same input
and output addresses every run, so the session binds fixed-shape device buffers once and
copies each request into them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from turboinfer.cache_folder import cache_folder
from turboinfer.engines.base import EngineSettings, Feeds, Precision, TensorSpec, check_feeds
from turboinfer.errors import ConfigError, InvalidInputError

GPU_EXTRA = ("pip install 'turboinfer[gpu]' (onnxruntime-gpu; uninstall the CPU-only "
             "onnxruntime first: both install the same onnxruntime module)")
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
CPU = "CPUExecutionProvider"
ProviderList = list[str | tuple[str, dict[str, str]]]


def tensorrt_cache_dir() -> Path:
    """Where TensorRT keeps built engines and timing caches between loads: ``tensorrt``
    in the project's cache folder."""
    return cache_folder("tensorrt", create=True)


def gpu_providers(settings: EngineSettings, device_id: int = 0) -> ProviderList:
    """The provider list with options for ``settings.device`` (cuda or tensorrt)."""
    flag = {True: "1", False: "0"}
    cuda: dict[str, str] = {"device_id": str(device_id)}
    if settings.cuda_graphs:
        cuda["enable_cuda_graph"] = "1"
    if settings.device == "cuda":
        if settings.precision not in (Precision.FP32, Precision.TF32):
            raise ConfigError(f"precision {settings.precision.value} on onnxruntime needs "
                              "device tensorrt (the CUDA provider runs the model's own "
                              "types: convert the model to fp16 instead)")
        cuda["use_tf32"] = flag[settings.precision is Precision.TF32]
        return [(CUDA, cuda), CPU]
    cache = str(tensorrt_cache_dir())
    trt = {
        "device_id": str(device_id),
        "trt_fp16_enable": flag[settings.precision is Precision.FP16],
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": cache,
        "trt_cuda_graph_enable": flag[settings.cuda_graphs],
    }
    if settings.precision is Precision.BF16:
        trt["trt_bf16_enable"] = "1"  # a newer key: set only when asked, older ORTs lack it
    cuda.pop("enable_cuda_graph", None)  # the fallback provider runs what TensorRT cannot
    return [(TENSORRT, trt), (CUDA, cuda), CPU]


def check_available(device: str, available: list[str] | None = None) -> None:
    wanted = TENSORRT if device == "tensorrt" else CUDA
    have = available if available is not None else ort.get_available_providers()
    if wanted not in have:
        raise ConfigError(f"device {device!r} needs ONNX Runtime's {wanted}, which this "
                          f"install lacks (it has {', '.join(sorted(have))}): {GPU_EXTRA}")


class BoundRun:
    """Runs a session through I/O binding: inputs copied into device buffers that are
    reused while their shape holds, outputs left on the device until the final copy.
    ``fixed`` (CUDA graphs): every buffer is allocated once at load from the specs."""

    def __init__(self, session: ort.InferenceSession, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], device: str = "cuda", device_id: int = 0,
                 fixed: bool = False) -> None:
        self._session = session
        self._binding = session.io_binding()
        self._device, self._device_id = device, device_id
        self._fixed = fixed
        self._input_specs = inputs
        self._output_names = [spec.name for spec in outputs]
        self._inputs: dict[str, Any] = {}
        self._outputs: list[Any] = []
        if fixed:
            for spec in inputs:
                self._bind_input(spec.name, _fixed_shape(spec), spec.dtype)
            for spec in outputs:
                value = ort.OrtValue.ortvalue_from_shape_and_type(
                    list(_fixed_shape(spec)), spec.dtype, device, device_id)
                self._binding.bind_ortvalue_output(spec.name, value)
                self._outputs.append(value)
        else:
            self._bind_outputs()

    def _bind_outputs(self) -> None:
        """Unallocated device outputs: ONNX Runtime allocates them at the next run and
        keeps them bound, so they are rebound whenever an input's shape changes."""
        for name in self._output_names:
            self._binding.bind_output(name, self._device, self._device_id)

    def _bind_input(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self._device,
                                                          self._device_id)
        self._binding.bind_ortvalue_input(name, value)
        self._inputs[name] = (value, shape, dtype)
        return value

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        for spec in self._input_specs:
            array = np.ascontiguousarray(feeds[spec.name])
            bound = self._inputs.get(spec.name)
            if bound is None or bound[1] != array.shape or bound[2] != array.dtype:
                if self._fixed:
                    check_feeds(self._input_specs, feeds)
                    raise InvalidInputError(
                        f"input {spec.name!r} has shape {list(array.shape)}; with CUDA "
                        f"graphs the model runs at {list(bound[1]) if bound else '?'} only")
                value = self._bind_input(spec.name, array.shape, array.dtype)
                self._bind_outputs()
            else:
                value = bound[0]
            value.update_inplace(array)
        self._session.run_with_iobinding(self._binding)
        if self._fixed:
            # On a GPU numpy() is the copy to the host; on the CPU it is a view of the
            # bound buffer, which the next run overwrites.
            host = self._device == "cpu"
            return {name: value.numpy().copy() if host else value.numpy() for name, value
                    in zip(self._output_names, self._outputs, strict=True)}
        values = self._binding.copy_outputs_to_cpu()
        return dict(zip(self._output_names, values, strict=True))


def _fixed_shape(spec: TensorSpec) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in spec.shape):
        raise ConfigError(f"cuda_graphs on onnxruntime needs fixed shapes; {spec.name!r} is "
                          f"{list(spec.shape)}: export the model at one batch size")
    return tuple(int(d) for d in spec.shape)  # type: ignore[arg-type]
