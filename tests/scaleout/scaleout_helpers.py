"""What the scale-out tests borrow from tests/serve: its server starter, model builders
and HTTP conformance tests. Its ``conftest`` cannot be imported by that name from here,
so each module of tests/serve is loaded once by path under its own name (the name the
fault scenarios use for the fixtures, so both share one copy)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SERVE_TESTS = Path(__file__).parents[1] / "serve"


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


serve_fixtures = serve_module("serve_fixtures", "conftest.py")
http_conformance = serve_module("serve_http_conformance", "test_http.py")
