"""Fixtures for the LLM engine tests: tiny random models (hidden 64, 2 layers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm_helpers import save_random_hf_model, save_word_tokenizer

from turboinfer.llm.backends.cpu.native import NativeLibrary, build_library
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_hf_model(tmp_path_factory.mktemp("tiny_llama"))


# No -march=native: the plain C path of every kernel.
PLAIN_FLAGS = ("-O2", "-fPIC", "-shared", "-pthread")


@pytest.fixture(scope="session")
def plain_library(tmp_path_factory: pytest.TempPathFactory) -> NativeLibrary:
    """The kernels built as plain C, compiled once for every module that compares it."""
    status = build_library("cc", PLAIN_FLAGS, folder=tmp_path_factory.mktemp("plain"))
    assert status.library is not None, status.reason
    assert status.library.simd_level == 0
    return status.library


@pytest.fixture(scope="session")
def tiny_model(tiny_llama_dir: Path) -> LlamaModel:
    return load_model(tiny_llama_dir)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> LlamaModel:
    folder = save_random_hf_model(tmp_path_factory.mktemp("tiny_draft"), seed=1,
                                  num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    return load_model(folder)




@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    # The models here are tiny: intra-op threads only add synchronisation, and on a
    # loaded machine a descheduled worker thread stalls every op (measured 8 ms vs
    # 200 ms per engine step).
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_llm_dir(tiny_llama_dir: Path) -> Path:
    """The tiny model with a tokenizer: a complete folder for ``LLM`` and the CLI."""
    save_word_tokenizer(tiny_llama_dir)
    return tiny_llama_dir
