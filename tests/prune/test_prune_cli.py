"""``turboinfer prune`` end to end on digits-cnn, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from turboinfer.cli import main


def test_prune_writes_state_onnx_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["prune", "builtin:digits-cnn", "--target-sparsity", "0.5",
                 "--schedule", "l1:0.3,taylor:0.2", "--distill-epochs", "1",
                 "--train-threads", "1", "--latency-seconds", "0.25", "-o", str(out), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["schedule"] == ["l1:0.3", "taylor:0.2"]
    assert report["macs"]["after"] < report["macs"]["before"]
    assert set(report["metric"]) >= {"before", "after_pruning", "after_distillation"}
    assert {"original", "pruned"} <= set(report["latency_onnxruntime"])
    layers = {row["name"]: row for row in report["layers"]}
    assert layers["features.0"]["out_after"] == 32 and layers["features.3"]["out_after"] == 32
    assert (out / "pruned.pt").is_file() and (out / "report.json").is_file()
    session = ort.InferenceSession(str(out / "model.onnx"))
    logits = session.run(None, {"input": np.zeros((3, 1, 8, 8), np.float32)})[0]
    assert logits.shape == (3, 10)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target-sparsity", "1.2"], "target sparsity 1.2 is not in (0, 1)"),
        (["--target-sparsity", "0"], "target sparsity 0.0 is not in (0, 1)"),
        (["--schedule", "l1:0.3,taylor:0.1"], "make the amounts add up"),
        (["--schedule", "random:0.5"], "unknown pruning criterion 'random'"),
        (["--protect", "middle"], "unknown --protect value 'middle'"),
    ],
)
def test_bad_settings_fail_with_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prune", "builtin:digits-cnn", *argv, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_training_data_that_does_not_fit_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "train.npz"
    np.savez(data, input=np.zeros((8, 3, 8, 8), np.float32), labels=np.zeros(8, np.int64))
    code = main(["prune", "builtin:digits-cnn", "--train-data", str(data), "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "training data does not fit the model (inputs of shape [8, 3, 8, 8])" in err
    assert err.count("\n") == 1


def test_an_onnx_file_is_refused_with_the_reason(
    linear_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prune", str(linear_onnx), "-o", str(tmp_path)]) == 2
    assert "pruning needs the PyTorch model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["builtin:digits-cnn"], (10, 1e-4, 64)),
        (["builtin:minilm"], (2, 3e-4, 32)),  # its own training settings
        (["builtin:minilm", "--distill-epochs", "3", "--lr", "1e-3", "--batch-size", "8"],
         (3, 1e-3, 8)),  # what the user sets wins
    ],
)
def test_training_defaults_follow_the_builtin_model(
    argv: list[str], expected: tuple[int, float, int]
) -> None:
    import argparse

    from turboinfer.commands import prune

    parser = argparse.ArgumentParser()
    prune.add_arguments(parser)
    settings = prune.build_settings(parser.parse_args([*argv, "-o", "out"]))
    assert (settings.distill.epochs, settings.distill.lr, settings.batch_size) == expected
