"""``load --input-data`` with image files and text lines against a server that
pre-processes them, and the report's split of server time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from real_server import RealServer, serve_repository
from serve.prepost_models import image_classifier, photo, token_model, tokenizer
from turboinfer.cli import main
from turboinfer.errors import InvalidInputError
from turboinfer.load.inputs import ModelInfo, TensorInfo
from turboinfer.load.raw_data import raw_requests
from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, run_load
from turboinfer.serve.config import ModelConfig, write_entry
from turboinfer.serve.prepost_config import ImagePreprocess, Postprocess, TextPreprocess

QUICK = ScenarioSettings(scenario=Scenario.CONCURRENCY, concurrency=(4,), duration_s=0.6,
                         window_s=0.3, warmup_s=0.1, timeout_s=10.0, stability=10.0,
                         max_windows=3)


@pytest.fixture(scope="module")
def prepost_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    root = tmp_path_factory.mktemp("raw-repo")
    files = tmp_path_factory.mktemp("raw-files")
    write_entry(root, "img", image_classifier(files / "img.onnx"), ModelConfig(
        max_batch_size=8,
        preprocess=(ImagePreprocess(kind="image", resize=40, crop=32),),
        postprocess=(Postprocess(kind="argmax", output="logits", name="class"),)))
    write_entry(root, "txt", token_model(files / "txt.onnx"), ModelConfig(
        max_batch_size=8, preprocess=(TextPreprocess(kind="text"),)))
    tokenizer(root / "txt" / "tokenizer.json")
    with serve_repository(root, files / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for seed in range(5):
        (folder / f"{seed}.jpg").write_bytes(photo(120, 90, seed=seed))
    (folder / "notes.txt").write_text("not an image: skipped")
    return folder


def test_image_folder_splits_server_time(prepost_server: RealServer, images: Path) -> None:
    report = run_load(LoadSettings(url=prepost_server.http_url, model="img",
                                   input_file=images, batch_size=2, min_requests=5,
                                   scenario=QUICK))
    assert report.settings["inputs"]["image"]["requests"] == 2
    run = report.runs[0]
    assert run.ok > 0 and run.failed == 0, run.errors
    server = run.server
    assert server is not None
    assert server.preprocess_ms is not None and server.preprocess_ms > 0
    assert server.postprocess_ms is not None
    assert server.queue_ms is not None and server.compute_ms is not None


def test_text_lines_through_the_cli(prepost_server: RealServer, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat sat\n\na dog ran far away\nthe quick brown mat\n")
    code = main(["load", prepost_server.http_url, "--model", "txt", "--input-data",
                 str(lines), "--duration", "0.4", "--window", "0.2", "--warmup", "0",
                 "--min-requests", "5", "--min-duration", "0.1", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "pre_ms" in out and "post_ms" in out and "compute_ms" in out


def test_a_model_without_that_input_is_refused(prepost_server: RealServer,
                                                images: Path) -> None:
    with pytest.raises(InvalidInputError, match="takes no raw image input"):
        run_load(LoadSettings(url=prepost_server.http_url, model="txt", input_file=images,
                              scenario=QUICK))


def test_a_server_that_declares_no_preprocessing_gets_its_one_bytes_input(
        images: Path) -> None:
    # Triton's metadata for a batching model (PyTriton, the Python backend): one BYTES
    # input [-1, 1] and nothing that says it takes images.
    triton = ModelInfo("jpeg", "1", (TensorInfo("image", "BYTES", (-1, 1)),),
                       (TensorInfo("logits", "FP32", (-1, 1000)),), max_batch_size=32)
    requests = raw_requests(images, triton, batch_size=2)
    assert [list(r) for r in requests] == [["image"], ["image"]]
    assert requests[0]["image"].shape == (2, 1)
    assert requests[0]["image"][0, 0] == (images / "0.jpg").read_bytes()
    flat = ModelInfo("jpeg", "1", (TensorInfo("image", "BYTES", (-1,)),), ())
    assert raw_requests(images, flat, batch_size=1)[0]["image"].shape == (1,)


def test_a_tensor_model_without_raw_inputs_is_still_refused(images: Path) -> None:
    two = ModelInfo("two", "1", (TensorInfo("a", "BYTES", (-1, 1)),
                                 TensorInfo("b", "FP32", (-1, 4))), ())
    with pytest.raises(InvalidInputError, match="takes no raw image input"):
        raw_requests(images, two, batch_size=1)
    floats = ModelInfo("f", "1", (TensorInfo("x", "FP32", (-1, 4)),), ())
    with pytest.raises(InvalidInputError, match="takes no raw image input"):
        raw_requests(images, floats, batch_size=1)
