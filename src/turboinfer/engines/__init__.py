"""Engine registry: name -> adapter module, imported only when asked for.

A missing optional engine fails with a message that names the extra to install.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from turboinfer.engines.base import (
    CompileMode,
    Engine,
    EngineSettings,
    ExecutionMode,
    GraphOptimization,
    ModelArtifact,
    Precision,
    Session,
    TensorSpec,
    Toggle,
)
from turboinfer.errors import ConfigError, MissingDependencyError

__all__ = [
    "ENGINES",
    "CompileMode",
    "Engine",
    "EngineSettings",
    "ExecutionMode",
    "GraphOptimization",
    "ModelArtifact",
    "Precision",
    "Session",
    "TensorSpec",
    "Toggle",
    "available_engines",
    "get_engine",
    "load_session",
]


@dataclass(frozen=True)
class EngineInfo:
    module: str  # adapter module, imported lazily
    requires: str  # the package the adapter needs
    extra: str | None  # pip extra that installs it, None when it is a core dependency


ENGINES: dict[str, EngineInfo] = {
    "onnxruntime": EngineInfo("turboinfer.engines.onnxruntime", "onnxruntime", None),
    "openvino": EngineInfo("turboinfer.engines.openvino", "openvino", "openvino"),
    "torch": EngineInfo("turboinfer.engines.torch", "torch", None),
}


def get_engine(name: str) -> Engine:
    try:
        info = ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}") from None
    if importlib.util.find_spec(info.requires) is None:
        package = f"'turboinfer[{info.extra}]'" if info.extra else info.requires
        hint = f"pip install {package}"
        raise MissingDependencyError(f"engine {name!r} needs {info.requires}: {hint}")
    module = importlib.import_module(info.module)
    engine: Engine = module.ENGINE
    return engine


def available_engines() -> list[str]:
    return [name for name, info in ENGINES.items() if importlib.util.find_spec(info.requires)]


def load_session(
    artifact: ModelArtifact, engine: str = "onnxruntime", settings: EngineSettings | None = None
) -> Session:
    return get_engine(engine).load(artifact, settings or EngineSettings())
