"""ONNX Runtime adapter: CPU, and the CUDA / TensorRT execution providers when present."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from turboinfer.engines.base import (
    EngineSettings,
    ExecutionMode,
    Feeds,
    GraphOptimization,
    ModelArtifact,
    SpecsSession,
    TensorSpec,
    check_feeds,
)
from turboinfer.engines.onnxruntime_gpu import (
    BoundRun,
    ProviderList,
    check_available,
    gpu_providers,
)
from turboinfer.errors import (
    ConfigError,
    InferenceError,
    InvalidInputError,
    ModelLoadError,
    UnknownModelError,
)

_ORT_DTYPES: dict[str, np.dtype] = {
    f"tensor({name})": np.dtype(dtype)
    for name, dtype in {
        "float": "float32",
        "float16": "float16",
        "double": "float64",
        "int8": "int8",
        "uint8": "uint8",
        "int16": "int16",
        "uint16": "uint16",
        "int32": "int32",
        "uint32": "uint32",
        "int64": "int64",
        "uint64": "uint64",
        "bool": "bool",
        "string": "object",
    }.items()
}

_GRAPH_LEVELS = {
    GraphOptimization.DISABLED: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    GraphOptimization.BASIC: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    GraphOptimization.EXTENDED: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    GraphOptimization.ALL: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}



def session_options(settings: EngineSettings) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL
        if settings.execution_mode is ExecutionMode.PARALLEL
        else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    options.graph_optimization_level = _GRAPH_LEVELS[settings.graph_optimization]
    options.enable_cpu_mem_arena = settings.memory_arena
    if not settings.spin_wait:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: warnings would pollute --json runs
    return options


def providers_for(device: str, settings: EngineSettings | None = None) -> ProviderList:
    """The execution providers, with their options, for ``device``; a GPU device on an
    install without its provider is a ConfigError that names the extra."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    check_available(device)
    return gpu_providers(settings if settings is not None else EngineSettings(device=device))


def _spec(arg: ort.NodeArg) -> TensorSpec:
    dtype = _ORT_DTYPES.get(arg.type, np.dtype("float32"))
    return TensorSpec(arg.name, dtype, tuple(arg.shape))


class OrtSession(SpecsSession):
    """A wrapped ``InferenceSession``. ``run`` adds no work on the success path.

    ``bound`` (a GPU provider): runs go through I/O binding, the tensors stay on the
    device between the copy in and the copy out."""

    def __init__(self, session: ort.InferenceSession, bound: BoundRun | None = None) -> None:
        super().__init__([_spec(arg) for arg in session.get_inputs()],
                         [_spec(arg) for arg in session.get_outputs()])
        self.session = session
        self._output_names = [spec.name for spec in self._outputs]
        self._bound = bound

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        try:
            if self._bound is not None:
                return self._bound.run(feeds)
            values = self.session.run(self._output_names, feeds)
        except KeyError:
            check_feeds(self._inputs, feeds)
            raise
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument,
                ort.capi.onnxruntime_pybind11_state.Fail,
                ort.capi.onnxruntime_pybind11_state.RuntimeException,
                ValueError, TypeError, RuntimeError) as exc:
            first = _first_line(exc)
            if _ALLOCATION_FAILED in str(exc):
                # The inputs are valid; this process could not get the memory for them:
                # the server's fault (and its max_batch_size's), not the request's.
                raise InferenceError(f"onnxruntime ran out of memory: {first}") from None
            check_feeds(self._inputs, feeds)
            raise InvalidInputError(f"onnxruntime could not run the inputs: {first}") from None
        return dict(zip(self._output_names, values, strict=True))


# ONNX Runtime's words when an allocator cannot get a buffer (BFCArena, the CPU allocator).
_ALLOCATION_FAILED = "Failed to allocate memory"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class OnnxRuntimeEngine:
    name = "onnxruntime"

    def load(self, model: ModelArtifact, settings: EngineSettings) -> OrtSession:
        if not model.onnx_path.is_file():
            raise UnknownModelError(f"model file not found: {model.onnx_path}")
        settings.refuse_forms(self.name, {"precision", "cuda_graphs"} if settings.on_gpu
                              else set())
        try:
            session = ort.InferenceSession(
                str(model.onnx_path),
                sess_options=session_options(settings),
                providers=providers_for(settings.device, settings),
            )
        except ConfigError:
            raise
        except Exception as exc:  # ORT raises bare pybind errors; report them in one line
            raise ModelLoadError(
                f"onnxruntime cannot load {model.onnx_path}: {_first_line(exc)}"
            ) from None
        if not settings.on_gpu:
            return OrtSession(session)
        plain = OrtSession(session)
        return OrtSession(session, BoundRun(session, plain.inputs, plain.outputs,
                                            fixed=settings.cuda_graphs))


ENGINE = OnnxRuntimeEngine()
