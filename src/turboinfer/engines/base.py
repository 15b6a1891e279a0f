"""The engine protocol: load a model file with typed settings, describe it, run a batch.

Every engine adapter is one module with one ``Engine`` implementation. Adapters are
registered by name in ``turboinfer.engines`` and imported lazily, so an optional engine
that is not installed only fails when it is asked for.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from turboinfer.errors import ConfigError, InvalidInputError

# A dimension is a fixed size, or a symbolic name (or None) when it is dynamic.
Dim = int | str | None


class ExecutionMode(str, enum.Enum):
    SEQUENTIAL = "sequential"
    PARALLEL = "parallel"


class GraphOptimization(str, enum.Enum):
    DISABLED = "disabled"
    BASIC = "basic"
    EXTENDED = "extended"
    ALL = "all"


DEVICES = ("cpu", "cuda", "tensorrt")
GPU_DEVICES = ("cuda", "tensorrt")


class Precision(str, enum.Enum):
    """The arithmetic of the weights and activations. ``tf32`` keeps FP32 tensors and lets
    CUDA tensor cores round matmul and convolution inputs to 10-bit mantissas."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"


class Toggle(str, enum.Enum):
    ON = "on"
    OFF = "off"
    AUTO = "auto"


class CompileMode(str, enum.Enum):
    """``torch.compile`` at load (``none``: eager), by its ``mode`` argument."""

    NONE = "none"
    DEFAULT = "default"
    REDUCE_OVERHEAD = "reduce-overhead"
    MAX_AUTOTUNE = "max-autotune"
    MAX_AUTOTUNE_NO_CUDAGRAPHS = "max-autotune-no-cudagraphs"


@dataclass(frozen=True)
class EngineSettings:
    """What matters for latency, typed. ``0`` threads lets the engine pick.

    ``device`` is ``"cpu"``, ``"cuda"`` or ``"tensorrt"`` (ONNX Runtime's TensorRT
    execution provider); engines that cannot honour it say so.
    """

    intra_op_threads: int = 0
    inter_op_threads: int = 0
    execution_mode: ExecutionMode = ExecutionMode.SEQUENTIAL
    graph_optimization: GraphOptimization = GraphOptimization.ALL
    memory_arena: bool = True
    device: str = "cpu"
    # Intra-op threads spin between runs (ONNX Runtime's default): the lowest latency
    # back to back, but they burn cores that a server's event loop and clients need.
    spin_wait: bool = True
    # The forms a model runs in on an accelerator (the torch engine; ONNX Runtime's
    # TensorRT provider takes fp16/bf16 and both GPU providers take cuda_graphs).
    precision: Precision = Precision.FP32
    channels_last: Toggle = Toggle.AUTO  # 4-D convolution inputs as NHWC
    compile: CompileMode = CompileMode.NONE
    cuda_graphs: bool = False  # one graph per batch-size bucket, captured at load
    # The largest batch a run will get (a server's max_batch_size): CUDA graphs and
    # compiled kernels are made at load for buckets up to it. 0: batch 1 only.
    max_batch_size: int = 0

    def __post_init__(self) -> None:
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ConfigError("thread counts must be >= 0 (0 lets the engine choose)")
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}: use one of {', '.join(DEVICES)}")
        if self.max_batch_size < 0:
            raise ConfigError("max_batch_size must be >= 0")
        if self.cuda_graphs and self.device not in GPU_DEVICES:
            raise ConfigError(f"cuda_graphs needs a GPU device (cuda or tensorrt), "
                              f"not {self.device!r}")

    @property
    def on_gpu(self) -> bool:
        return self.device in GPU_DEVICES

    def refuse_forms(self, engine: str, allowed: set[str]) -> None:
        """ConfigError naming the first torch form set that ``engine`` cannot honour."""
        defaults = EngineSettings()
        for name in ("precision", "channels_last", "compile", "cuda_graphs"):
            value = getattr(self, name)
            if name not in allowed and value != getattr(defaults, name) and not (
                    name == "channels_last" and value is Toggle.OFF):
                shown = value.value if isinstance(value, enum.Enum) else value
                raise ConfigError(f"the {engine} engine does not take {name}={shown}")


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype and shape of one model input or output."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}


Feeds = Mapping[str, np.ndarray]


@runtime_checkable
class Session(Protocol):
    """A loaded model, ready to run. ``run`` is the hot path."""

    @property
    def inputs(self) -> list[TensorSpec]: ...

    @property
    def outputs(self) -> list[TensorSpec]: ...

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]: ...


class SpecsSession:
    """Holds a session's input and output specs; adapters subclass it and add ``run``."""

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
        self._inputs = inputs
        self._outputs = outputs

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._outputs


class Engine(Protocol):
    """A factory of sessions. ``name`` is the registry key."""

    name: str

    def load(self, model: ModelArtifact, settings: EngineSettings) -> Session: ...


@dataclass(frozen=True)
class ModelArtifact:
    """What an engine can load: an ONNX file, and for PyTorch eager, the module itself.

    ``torch_module`` is a zero-argument factory so that the (sometimes slow) build only
    happens when the torch engine is used.
    """

    name: str
    onnx_path: Path
    torch_module: object | None = None  # Callable[[], torch.nn.Module]

    def __post_init__(self) -> None:
        if self.torch_module is not None and not callable(self.torch_module):
            raise ConfigError("torch_module must be a zero-argument factory")


def check_feeds(specs: list[TensorSpec], feeds: Feeds) -> None:
    """Raise ``InvalidInputError`` naming the first input that does not fit ``specs``.

    Engines call this only after a run failed, so the hot path pays nothing for it and
    the user still gets a message that names the input, the expected and the actual.
    """
    expected = {spec.name for spec in specs}
    unknown = sorted(set(feeds) - expected)
    if unknown:
        raise InvalidInputError(
            f"unknown input {unknown[0]!r}; the model takes {', '.join(sorted(expected))}"
        )
    for spec in specs:
        if spec.name not in feeds:
            raise InvalidInputError(f"missing input {spec.name!r}")
        array = np.asarray(feeds[spec.name])
        if array.dtype != spec.dtype:
            raise InvalidInputError(
                f"input {spec.name!r} has dtype {array.dtype.name}, expected {spec.dtype.name}"
            )
        if array.ndim != len(spec.shape) or any(
            isinstance(dim, int) and dim != size
            for dim, size in zip(spec.shape, array.shape, strict=False)
        ):
            raise InvalidInputError(
                f"input {spec.name!r} has shape {list(array.shape)}, "
                f"expected {format_shape(spec.shape)}"
            )


def format_shape(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
