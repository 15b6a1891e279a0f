"""Fixtures: one tiny random Mixtral (4 experts, top-2) and one Qwen2-MoE (8 experts,
top-2, shared expert) folder per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from moe_helpers import save_random_moe_model


@pytest.fixture(scope="session")
def mixtral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_moe_model(tmp_path_factory.mktemp("mixtral"), "mixtral")


@pytest.fixture(scope="session")
def qwen2_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_moe_model(tmp_path_factory.mktemp("qwen2_moe"), "qwen2_moe")
