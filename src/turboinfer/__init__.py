"""turboinfer: take a trained model and make it answer fast.

The Python API mirrors the command line:

- ``turboinfer.optimize(model, output_dir, ...)`` builds and judges optimized variants;
- ``turboinfer.tune(model, repo, slo_p99_ms=..., max_accuracy_drop=...)`` picks the
  fastest configuration within the SLO and accuracy budget and writes a repository entry;
- ``turboinfer.llm.LLM(...)`` generates text with the paged-KV engine.

Submodules load on first use, so ``import turboinfer`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "optimize", "tune"]


def __getattr__(name: str) -> Any:
    if name == "optimize":
        return importlib.import_module("turboinfer.optimize")  # a callable module
    if name == "tune":
        return importlib.import_module("turboinfer.optimize").tune
    raise AttributeError(f"module 'turboinfer' has no attribute {name!r}")
