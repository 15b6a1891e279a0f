"""One real ``turboinfer llm serve`` process on the demo model, shared by the server tests,
and the in-process engine that gives the reference outputs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llm_server_helpers import DEVICE, DTYPE, KV_CACHE_TOKENS, Server, launch

from turboinfer.llm import LLM, EngineConfig


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with launch(tmp_path_factory.mktemp("llm_server")) as running:
        yield running


@pytest.fixture(scope="session")
def reference() -> LLM:
    """The in-process engine the server's greedy output must equal."""
    return LLM(config=EngineConfig(kv_cache_tokens=KV_CACHE_TOKENS), device=DEVICE,
               dtype=DTYPE)
