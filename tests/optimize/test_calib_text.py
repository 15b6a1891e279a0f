"""``--calib-text``: text lines tokenized with the model folder's own tokenizer become
calibration (and held-out fidelity) inputs of a text model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serve.prepost_models import WORDS, token_model, tokenizer
from turboinfer.cli import main
from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.optimize.data.calibration import load_calibration
from turboinfer.optimize.data.text import load_text
from turboinfer.optimize.settings import OptimizeSettings

SPECS = [TensorSpec("input_ids", np.dtype(np.int64), ("batch", "seq")),
         TensorSpec("attention_mask", np.dtype(np.int64), ("batch", "seq"))]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    token_model(model / "model.onnx")
    tokenizer(model / "tokenizer.json")
    lines = [" ".join(WORDS[i % len(WORDS)] for i in range(start, start + 1 + start % 5))
             for start in range(12)]
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n\n")
    return model


def test_lines_become_padded_token_inputs(folder: Path) -> None:
    feeds = load_text(folder.parent / "lines.txt", folder / "tokenizer.json", SPECS, 100)
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.shape == mask.shape == (12, 5)  # 12 lines, the longest has 5 words
    assert mask[0].tolist() == [1, 0, 0, 0, 0]
    assert ids[0, 0] == 2 and ids[0, 1:].tolist() == [0, 0, 0, 0]  # "the", then [PAD]


def test_held_out_lines_check_fidelity(folder: Path) -> None:
    settings = OptimizeSettings(calib_text=folder.parent / "lines.txt",
                                tokenizer=folder / "tokenizer.json")
    calib = load_calibration(None, SPECS, settings, hold_out=True)
    assert calib.source.startswith("text lines of")
    assert calib.held_out is not None and calib.count + len(calib.held_out["input_ids"]) == 12


def test_errors_are_one_line(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer\.json"):
        load_text(folder.parent / "lines.txt", None, SPECS, 10)
    image = [TensorSpec("input", np.dtype(np.float32), ("batch", 3, 8, 8))]
    with pytest.raises(InvalidInputError, match="input_ids"):
        load_text(folder.parent / "lines.txt", folder / "tokenizer.json", image, 10)
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ConfigError, match="no text lines"):
        load_text(tmp_path / "empty.txt", folder / "tokenizer.json", SPECS, 10)


def test_optimize_cli_takes_the_folder_tokenizer(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(["optimize", str(folder / "model.onnx"), "--output", str(out),
                 "--variants", "int8-static", "--calibration", "minmax",
                 "--calib-text", str(folder.parent / "lines.txt"),
                 "--tokenizer", str(folder / "tokenizer.json"),
                 "--max-accuracy-drop", "1%"])
    assert code == 0
    assert (out / "report.json").is_file()
