"""Modules of tests/serve for the test folders that borrow from it (faults, scaleout).

Its ``conftest`` cannot be imported by that name from elsewhere (other folders have a
conftest too), so each module is loaded once by path under its own name, and every
borrower shares that one copy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SERVE_TESTS = Path(__file__).parent / "serve"


def serve_module(name: str, filename: str) -> ModuleType:
    """``tests/serve/<filename>`` as the module ``name``, loaded on first use."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SERVE_TESTS / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
