"""PyTorch adapter: the model's own ``nn.Module``, eager FP32 (the baseline to beat) or
in the forms that decide GPU speed: TF32/FP16/BF16, channels_last, torch.compile at
load, CUDA graphs per batch-size bucket with pinned staging on the instance's stream.

Input and output names come from the model's ONNX export, so feeds and results are
interchangeable with the other engines. The CUDA-only parts are ``cuda.py``; everything
else runs (and is tested) on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from turboinfer.engines.base import (
    CompileMode,
    EngineSettings,
    ModelArtifact,
    TensorSpec,
)
from turboinfer.engines.torch.buckets import bucket_sizes
from turboinfer.engines.torch.cuda import CudaRunner, free_memory
from turboinfer.engines.torch.direct import DirectRunner
from turboinfer.engines.torch.forms import Form, make_forward, prepare, resolve_form, use_tf32
from turboinfer.engines.torch.session import Runner, TorchSession
from turboinfer.engines.torch.specs import read_specs
from turboinfer.errors import ConfigError, ModelLoadError

GIB = 2**30


class TorchEngine:
    name = "torch"

    def load(self, model: ModelArtifact, settings: EngineSettings) -> TorchSession:
        if model.torch_module is None:
            raise ConfigError(
                f"the torch engine needs the PyTorch module; {model.name} is only an ONNX file"
            )
        device = torch_device(settings.device)
        if settings.intra_op_threads:
            # Process-wide in torch: the last session loaded decides.
            torch.set_num_threads(settings.intra_op_threads)
        inputs, outputs = read_specs(model.onnx_path)
        factory: Callable[[], torch.nn.Module] = model.torch_module  # type: ignore[assignment]
        module = factory()
        gpu = device.type == "cuda"
        bucketed = gpu and (settings.cuda_graphs or settings.compile is not CompileMode.NONE)
        form = resolve_form(settings, module, inputs, bucketed)
        weights = weight_bytes(module)
        try:
            runner = _build(module, form, settings, inputs, device)
        except torch.cuda.OutOfMemoryError:
            del module
            torch.cuda.empty_cache()
            raise ModelLoadError(does_not_fit(model.name, settings, weights,
                                              *free_memory(device))) from None
        except (ConfigError, ModelLoadError):
            raise
        except Exception as exc:  # an op torch.compile or a capture cannot take
            raise ModelLoadError(f"torch cannot prepare {model.name} as "
                                 f"{describe(form, settings)}: {_first_line(exc)}") from None
        return TorchSession(runner, inputs, outputs, device, {
            "precision": settings.precision.value, "channels_last": form.channels_last,
            "compile": form.compile.value,
            "cuda_graphs": sorted(getattr(runner, "graphs", {}))})


def torch_device(name: str) -> torch.device:
    if name == "tensorrt":
        raise ConfigError("device 'tensorrt' is ONNX Runtime's TensorRT provider; the torch "
                          "engine runs on 'cuda' or 'cpu'")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device 'cuda' needs a CUDA build of torch and a GPU; this torch "
                          f"({torch.__version__}) sees none: use device 'cpu'")
    return torch.device(name)


def _build(module: torch.nn.Module, form: Form, settings: EngineSettings,
           inputs: list[TensorSpec], device: torch.device) -> Runner:
    if device.type == "cuda":
        use_tf32(settings.precision)
    forward = make_forward(prepare(module, form, device), form, inputs)
    if device.type != "cuda":
        runner = DirectRunner(forward, device, settings.intra_op_threads)
        if form.compile is not CompileMode.NONE:
            _compile_on_cpu(runner, inputs, settings.max_batch_size)
        return runner
    bucketed = settings.cuda_graphs or form.compile is not CompileMode.NONE
    cuda = CudaRunner(forward, inputs, device,
                      bucket_sizes(settings.max_batch_size) if bucketed else ())
    if settings.cuda_graphs:
        cuda.capture()
    else:
        cuda.warm_up()
    return cuda


def _compile_on_cpu(runner: DirectRunner, inputs: list[TensorSpec], max_batch: int) -> None:
    """Compile at load: batch 1, then batch 2 (torch.compile specialises size 1 and makes
    the batch axis dynamic on the second size it sees), so no request waits for it."""
    batched = all(s.shape and not isinstance(s.shape[0], int) for s in inputs)
    for rows in ((1, 2) if batched and max_batch != 1 else (1,)):
        runner.run([np.zeros([rows if i == 0 and not isinstance(d, int) else
                              (d if isinstance(d, int) else 1)
                              for i, d in enumerate(s.shape)], dtype=s.dtype)
                    for s in inputs])


def weight_bytes(module: torch.nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def does_not_fit(name: str, settings: EngineSettings, weights: int, free: int,
                 total: int) -> str:
    """The load error of a model the GPU cannot hold: what it needed, what was free."""
    return (f"model {name!r} does not fit on the GPU: CUDA out of memory at load and "
            f"warm-up ({settings.precision.value}, batches up to "
            f"{max(1, settings.max_batch_size)}); its weights take {weights / GIB:.2f} GiB "
            f"in FP32, {free / GIB:.2f} of {total / GIB:.2f} GiB are free. Use fp16 or bf16, "
            "a smaller max_batch_size, or fewer instances")


def describe(form: Form, settings: EngineSettings) -> str:
    parts = [settings.precision.value]
    if form.channels_last:
        parts.append("channels_last")
    if form.compile is not CompileMode.NONE:
        parts.append(f"compile {form.compile.value}")
    if settings.cuda_graphs:
        parts.append("CUDA graphs")
    return " + ".join(parts)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


ENGINE = TorchEngine()

__all__ = ["ENGINE", "TorchEngine", "TorchSession", "does_not_fit"]
