"""Where the engine runs: ``cpu``, ``cuda`` (``cuda:N``) or ``auto``, and in what dtype.

Resolved once, when ``LLM`` loads: a name the machine cannot honour (``cuda`` without a
CUDA device, an unknown dtype) is a one-line ``InvalidInputError``, not a traceback at
the first step.
"""

from __future__ import annotations

import torch

from turboinfer.errors import InvalidInputError

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InvalidInputError(f"unknown device {name!r}; use cpu, cuda or auto") from None
    if device.type not in ("cpu", "cuda"):
        raise InvalidInputError(f"unknown device {name!r}; use cpu, cuda or auto")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidInputError("--device cuda: this machine has no CUDA device "
                                    f"(torch {torch.__version__}); use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InvalidInputError(f"--device {name}: only {torch.cuda.device_count()} "
                                    "CUDA devices here")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: float32 on the CPU (its kernels and the native step are float32), bfloat16
    on CUDA (tensor cores, and fp32's range: no overflow where fp16 could)."""
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    try:
        return _DTYPES[name]
    except KeyError:
        raise InvalidInputError(f"unknown dtype {name!r}; use one of "
                                f"{', '.join(DTYPES)}") from None


def runs_general(device: torch.device, dtype: torch.dtype, backend: str) -> bool:
    """Whether steps run on the general path over plain torch modules: anything but the
    CPU in float32 with the ``auto`` backend (the CPU's measured kernels and native
    steps, which are float32's)."""
    return device.type != "cpu" or backend == "torch" or dtype != torch.float32


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Where rank ``rank`` of a parallel group runs: the CPU for every rank, or on CUDA
    one GPU per rank counting from ``device``."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)
