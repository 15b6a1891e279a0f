"""Which inference engines this Python environment can import, and what each can reach.

A package that is missing, or installed but broken (a wheel built against another torch,
a missing shared library), is reported as not installed with the reason, never raised.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

from turboinfer.hardware.model import EngineProfile


def _describe_onnxruntime(ort: Any) -> EngineProfile:
    providers = tuple(ort.get_available_providers())
    return EngineProfile(
        name="onnxruntime", installed=True, version=ort.__version__, providers=providers,
        cuda="CUDAExecutionProvider" in providers or "TensorrtExecutionProvider" in providers,
    )


def _describe_openvino(ov: Any) -> EngineProfile:
    version = getattr(ov, "__version__", None) or ov.get_version()
    return EngineProfile(name="openvino", installed=True, version=str(version),
                         providers=tuple(ov.Core().available_devices))


def _describe_torch(torch: Any) -> EngineProfile:
    cuda = bool(torch.cuda.is_available())
    mps = getattr(torch.backends, "mps", None)
    devices = ("cpu",) + (("cuda",) if cuda else ()) + (
        ("mps",) if mps is not None and mps.is_available() else ())
    return EngineProfile(name="torch", installed=True, version=torch.__version__,
                         providers=devices, cuda=cuda)


# Engine name -> (module to import, how to describe it once imported).
ENGINE_PROBES: dict[str, tuple[str, Callable[[Any], EngineProfile]]] = {
    "onnxruntime": ("onnxruntime", _describe_onnxruntime),
    "openvino": ("openvino", _describe_openvino),
    "torch": ("torch", _describe_torch),
}


def probe_engine(name: str, module_name: str,
                 describe: Callable[[Any], EngineProfile]) -> EngineProfile:
    """One engine's profile; any failure to import or query it is a reason, not a crash."""
    try:
        if importlib.util.find_spec(module_name) is None:
            return EngineProfile(name=name, installed=False)
        with warnings.catch_warnings():
            # Import-time deprecation chatter is the package's business, not the report's.
            warnings.simplefilter("ignore")
            return describe(importlib.import_module(module_name))
    except Exception as exc:
        return EngineProfile(name=name, installed=False, error=f"{type(exc).__name__}: {exc}")


def read_engines() -> tuple[EngineProfile, ...]:
    return tuple(probe_engine(name, module, describe)
                 for name, (module, describe) in ENGINE_PROBES.items())
