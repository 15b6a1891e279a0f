"""Export of a Hugging Face model folder: a tiny randomly initialised BERT built from a
config and saved with ``save_pretrained``, no download."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config

from turboinfer.cli import main
from turboinfer.models.convert import ExportOptions, export_model


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        num_labels=3)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-bert")
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    return folder


def _edges(path: Path) -> tuple[dict[str, list[object]], dict[str, list[object]]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return ({i.name: list(i.shape) for i in session.get_inputs()},
            {o.name: list(o.shape) for o in session.get_outputs()})


def test_sequence_classification_from_architectures(bert_folder: Path, tmp_path: Path) -> None:
    report = export_model(str(bert_folder), tmp_path / "cls.onnx")
    inputs, outputs = _edges(report.path)
    assert inputs == {name: ["batch", "sequence"]
                      for name in ("input_ids", "attention_mask", "token_type_ids")}
    assert outputs == {"logits": ["batch", 3]}
    # The examples [2, 8] and every dynamic axis one longer.
    assert [c.shape for c in report.checks] == [(2, 3), (3, 3)]
    assert all(c.ok and c.cosine > 0.9999 for c in report.checks)


def test_feature_extraction(bert_folder: Path, tmp_path: Path) -> None:
    options = ExportOptions(task="feature-extraction")
    report = export_model(str(bert_folder), tmp_path / "features.onnx", options)
    assert _edges(report.path)[1] == {"last_hidden_state": ["batch", "sequence", 32]}
    assert [c.shape for c in report.checks] == [(2, 8, 32), (3, 9, 32)]
    assert all(c.ok for c in report.checks)


def test_unsupported_architecture_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2)
    config.architectures = ["GPT2LMHeadModel"]
    config.save_pretrained(tmp_path / "gpt2")
    assert main(["export", str(tmp_path / "gpt2"), "-o", str(tmp_path / "g.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GPT2LMHeadModel is not supported" in err
    assert main(["export", str(tmp_path / "gpt2"), "--task", "feature-extraction",
                 "-o", str(tmp_path / "g.onnx")]) == 2
    assert "'gpt2' is not an encoder" in capsys.readouterr().err
