"""Fixtures for the model sources and the zoo.

Builtins come from the real user cache so that a warm machine runs these tests fast;
on a clean machine the first run trains and exports them (about half a minute).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from turboinfer.models import ResolvedModel, resolve_model
from turboinfer.models.zoo import RunFn

OrtRunner = Callable[[Path], RunFn]


def ort_runner(path: Path) -> RunFn:
    """A ``run`` function over an ONNX Runtime session, as an engine session provides."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, dict(feeds)), strict=True))

    return run


@pytest.fixture(scope="session")
def ort_run() -> OrtRunner:
    return ort_runner


@pytest.fixture(scope="session")
def digits() -> ResolvedModel:
    return resolve_model("builtin:digits-cnn")


@pytest.fixture(scope="session")
def minilm() -> ResolvedModel:
    return resolve_model("builtin:minilm")


@pytest.fixture(scope="session")
def resnet18() -> ResolvedModel:
    return resolve_model("builtin:resnet18")


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache for tests that must not touch (or reuse) the user's."""
    monkeypatch.setenv("TURBOINFER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
