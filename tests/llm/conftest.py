"""Fixtures for the LLM engine tests: tiny random models (hidden 64, 2 layers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_helpers import save_random_hf_model

from turboinfer.llm.loader import load_model
from turboinfer.llm.model import LlamaModel


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_hf_model(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_model(tiny_llama_dir: Path) -> LlamaModel:
    return load_model(tiny_llama_dir)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> LlamaModel:
    folder = save_random_hf_model(tmp_path_factory.mktemp("tiny_draft"), seed=1,
                                  num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    return load_model(folder)


