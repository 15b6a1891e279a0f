"""``--variants qat`` end to end: trained, quantized by the static quantizer, judged."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from turboinfer.cli import main


def _variants(capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, object]]:
    report = json.loads(capsys.readouterr().out)
    return {v["name"]: v for v in report["variants"]}


def test_qat_on_digits_trains_on_its_split_and_is_a_qdq_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["optimize", "builtin:digits-cnn", "-o", str(tmp_path), "--variants", "qat",
                 "--qat-epochs", "1", "--calib-count", "64", "--json"])
    assert code == 0
    qat = _variants(capsys)["qat"]
    details = qat["details"]
    assert isinstance(details, dict)
    assert details["training_data"] == "digits-cnn's training split"
    assert len(details["loss_per_epoch"]) == 1 and details["ranges_trained"] == 3
    assert isinstance(qat["metric"], float) and qat["metric"] > 90
    ops = {n.op_type for n in onnx.load(str(tmp_path / "qat.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops


@pytest.fixture
def every_core() -> Iterator[None]:
    """Torch on every usable core for this test (the llm tests leave it at one thread
    for the rest of the session): ResNet-18's training epoch took 117 s at one thread,
    72 s at two."""
    before = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    yield
    torch.set_num_threads(before)


def test_qat_runs_on_resnet18(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              every_core: None) -> None:
    # Two training images of the user's (the zoo's split is digits' test's path): the
    # clip search runs ~170 forwards of its first batch, 16 images of the split's 64.
    train = tmp_path / "train.npz"
    images = np.random.default_rng(0).standard_normal((2, 3, 224, 224), dtype=np.float32)
    np.savez(train, input=images)
    code = main(["optimize", "builtin:resnet18", "-o", str(tmp_path / "out"), "--variants",
                 "qat", "--qat-epochs", "1", "--calib-count", "8", "--train-data", str(train),
                 "--json"])
    assert code == 0
    qat = _variants(capsys)["qat"]
    assert qat["skipped"] is None and (tmp_path / "out" / "qat.onnx").is_file()
    assert qat["details"]["training_data"] == f"--train-data {train}"


def test_qat_of_an_onnx_file_says_it_needs_the_pytorch_model(
    linear_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["optimize", str(linear_onnx), "-o", str(tmp_path), "--variants", "qat",
                 "--synthetic-calib", "--json"])
    assert code == 0
    assert "QAT needs the PyTorch model" in str(_variants(capsys)["qat"]["skipped"])
