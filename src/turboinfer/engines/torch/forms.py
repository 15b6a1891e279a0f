"""The form a torch module runs in: precision, memory format, compiled or eager.

Device-agnostic: the same code prepares a module for the CPU (fp32 or bf16, channels_last,
torch.compile) and for CUDA (also tf32 and fp16). Which form is fastest is measured
(``bench``, ``benchmarks/gpu/serve_acceptance.py``), never assumed; ``channels_last:
auto`` only turns NHWC on where cuDNN's tensor-core convolutions want it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from turboinfer.engines.base import CompileMode, EngineSettings, Precision, TensorSpec, Toggle
from turboinfer.errors import ConfigError

Forward = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]

_DTYPES = {Precision.FP16: torch.float16, Precision.BF16: torch.bfloat16}


@dataclass(frozen=True)
class Form:
    dtype: torch.dtype | None  # float tensors are cast to it; None: they stay FP32
    channels_last: bool
    compile: CompileMode
    dynamic: bool | None  # torch.compile's `dynamic`: None lets it notice a varying batch


def resolve_form(settings: EngineSettings, module: torch.nn.Module,
                 inputs: list[TensorSpec], bucketed: bool) -> Form:
    """The settings checked against the device and the model; ConfigError when a form
    cannot run there. ``bucketed``: batches are padded to fixed sizes (CUDA graphs or
    compiled kernels on a GPU), so compiled code is specialised per size."""
    precision, gpu = settings.precision, settings.on_gpu
    if not gpu and precision is Precision.FP16:
        raise ConfigError("precision fp16 runs on device cuda; on the CPU use bf16 or fp32")
    if not gpu and precision is Precision.TF32:
        raise ConfigError("precision tf32 is a CUDA tensor-core mode; on the CPU use fp32 "
                          "or bf16")
    if settings.cuda_graphs and settings.compile is CompileMode.REDUCE_OVERHEAD:
        raise ConfigError("compile reduce-overhead already replays CUDA graphs; with "
                          "cuda_graphs use compile default or max-autotune-no-cudagraphs")
    if settings.channels_last is Toggle.AUTO:
        # NHWC pays off where convolutions run on tensor cores: a GPU, reduced precision.
        channels_last = (gpu and precision in (Precision.FP16, Precision.BF16)
                         and has_conv2d(module) and any(_image(s) for s in inputs))
    else:
        channels_last = settings.channels_last is Toggle.ON
    return Form(_DTYPES.get(precision), channels_last, settings.compile,
                False if bucketed else None)


def has_conv2d(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in module.modules())


def _image(spec: TensorSpec) -> bool:
    return len(spec.shape) == 4 and spec.dtype.kind == "f"


def use_tf32(precision: Precision) -> None:
    """TF32 on CUDA matmuls and convolutions. Process-wide in torch: every model in the
    process that runs FP32 on the GPU then takes it (the last loaded decides)."""
    if precision is Precision.TF32:
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True


def prepare(module: torch.nn.Module, form: Form, device: torch.device) -> torch.nn.Module:
    module = module.eval().to(device)
    if form.dtype is not None:
        module = module.to(form.dtype)
    if form.channels_last:
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return module


def make_forward(module: torch.nn.Module, form: Form, inputs: list[TensorSpec]) -> Forward:
    """A function from input tensors (as the protocol sends them) to output tensors in
    FP32: the casts and the layout change run on the device, inside a CUDA graph when
    one is captured, instead of on the host per request."""
    runnable: Callable[..., object] = module
    if form.compile is not CompileMode.NONE:
        mode = None if form.compile is CompileMode.DEFAULT else form.compile.value
        runnable = torch.compile(module, mode=mode, dynamic=form.dynamic)
    dtype = form.dtype
    casts = [dtype if dtype is not None and s.dtype.kind == "f" else None for s in inputs]
    nhwc = [form.channels_last and _image(s) for s in inputs]

    def forward(args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        prepared = []
        for tensor, cast, layout in zip(args, casts, nhwc, strict=True):
            if cast is not None:
                tensor = tensor.to(cast)
            if layout:
                tensor = tensor.contiguous(memory_format=torch.channels_last)
            prepared.append(tensor)
        return [t.float() if t.is_floating_point() and t.dtype != torch.float32 else t
                for t in flat_tensors(runnable(*prepared))]

    return forward


def flat_tensors(result: object) -> list[torch.Tensor]:
    """A module's result as a list: a tensor, a tuple or list, a mapping (a Hugging Face
    output), nested, in order."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, Mapping):
        return [t for value in result.values() for t in flat_tensors(value)]
    if isinstance(result, tuple | list):
        return [t for value in result for t in flat_tensors(value)]
    raise ConfigError(f"the model returned {type(result).__name__}, not tensors")


TORCH_DTYPES = {np.dtype(k): v for k, v in {
    "float32": torch.float32, "float16": torch.float16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool}.items()}
