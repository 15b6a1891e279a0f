"""A real ``turboinfer serve`` with batching off, for the doctor's URL mode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from real_server import RealServer, serve_repository
from turboinfer.serve.config import ModelConfig, write_entry

MODEL = "linear"


@pytest.fixture(scope="module")
def unbatched(linear_onnx: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[RealServer]:
    """``turboinfer serve`` over ``linear`` with max_batch_size 0, one per test module."""
    repo = tmp_path_factory.mktemp("doctor-repo")
    write_entry(repo, MODEL, linear_onnx, ModelConfig(max_batch_size=0))
    with serve_repository(repo, tmp_path_factory.mktemp("doctor-log") / "serve.log") as server:
        yield server


@pytest.fixture(scope="module")
def unbatched_server(unbatched: RealServer) -> str:
    """Its HTTP URL."""
    return unbatched.http_url
