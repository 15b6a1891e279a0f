"""Pre- and post-processing in the real server: JPEG/PNG/WebP bytes and strings in,
labels, classes and embeddings out, bad inputs refused with a 400 naming the input."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from serve.conftest import Server
from serve.prepost_models import (
    CLASSES,
    WORDS,
    image_classifier,
    photo,
    png_header,
    token_model,
    tokenizer,
)
from turboinfer.serve.config import ModelConfig, load_config, write_entry
from turboinfer.serve.images import ImageDecoder
from turboinfer.serve.prepost_config import ImagePreprocess, Postprocess, TextPreprocess

IMAGE_PRE = ImagePreprocess(kind="image", resize=40, crop=32, max_pixels=1_000_000)
LABELS = ["apple", "banana", "cherry", "date"]


@pytest.fixture(scope="module")
def prepost_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prepost-repo")
    files = tmp_path_factory.mktemp("prepost-files")
    image_config = ModelConfig(
        max_batch_size=8, preprocess=(IMAGE_PRE,),
        postprocess=(Postprocess(kind="topk", output="logits", name="top2", k=2),
                     Postprocess(kind="argmax", output="logits", name="class")),
        labels={"logits": "labels.txt"})
    write_entry(root, "img", image_classifier(files / "img.onnx"), image_config)
    (root / "img" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    text_config = ModelConfig(
        max_batch_size=8, preprocess=(TextPreprocess(kind="text"),),
        postprocess=(Postprocess(kind="embedding", output="hidden", name="embedding",
                                 pool="mean"),))
    write_entry(root, "txt", token_model(files / "txt.onnx"), text_config)
    tokenizer(root / "txt" / "tokenizer.json")
    return root


@pytest.fixture(scope="module")
def prepost_server(prepost_repo: Path, launch: Any,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = launch(prepost_repo, tmp_path_factory.mktemp("log") / "server.log")
    yield running
    assert running.stop() == 0


def binary_body(inputs: dict[str, tuple[str, list[int], bytes]],
                outputs: list[dict[str, Any]] | None = None) -> tuple[bytes, dict[str, str]]:
    """An OIP body with binary tensors: (datatype, shape, raw bytes) per input."""
    header: dict[str, Any] = {"inputs": [
        {"name": name, "datatype": datatype, "shape": shape,
         "parameters": {"binary_data_size": len(raw)}}
        for name, (datatype, shape, raw) in inputs.items()]}
    if outputs is not None:
        header["outputs"] = outputs
    head = orjson.dumps(header)
    return head + b"".join(raw for _, _, raw in inputs.values()), {
        "Inference-Header-Content-Length": str(len(head))}


def byte_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def infer(server: Server, model: str, inputs: dict[str, tuple[str, list[int], bytes]],
          outputs: list[dict[str, Any]] | None = None) -> tuple[int, Any]:
    body, headers = binary_body(inputs, outputs)
    status, reply = server.request("POST", f"/v2/models/{model}/infer", body, headers)
    return status, orjson.loads(reply)


def outputs_by_name(doc: dict[str, Any]) -> dict[str, Any]:
    return {o["name"]: o for o in doc["outputs"]}


def decoded(*files: bytes) -> np.ndarray:
    """What the server's decoder makes of ``files``, computed here with the same code."""
    array = np.empty(len(files), dtype=object)
    array[:] = list(files)
    with ThreadPoolExecutor(1) as pool:
        decoder = ImageDecoder(IMAGE_PRE, np.dtype(np.float32), pool)
        return asyncio.run(decoder.decode("image", array))


def test_config_paths_resolve_under_the_model_folder(prepost_repo: Path) -> None:
    config = load_config(prepost_repo / "txt" / "config.yaml").with_files_under(
        prepost_repo / "txt")
    assert config.preprocess[0].kind == "text"
    assert Path(config.preprocess[0].tokenizer) == prepost_repo / "txt" / "tokenizer.json"


def test_metadata_lists_raw_inputs_beside_the_tensors(prepost_server: Server) -> None:
    status, body = prepost_server.request("GET", "/v2/models/img")
    doc = orjson.loads(body)
    assert status == 200
    inputs = {i["name"]: i for i in doc["inputs"]}
    assert inputs["image"]["datatype"] == "BYTES"
    assert inputs["image"]["parameters"] == {"preprocess": "image", "fills": "input"}
    assert {"input", "image"} <= set(inputs)
    assert {"logits", "top2", "class"} <= {o["name"] for o in doc["outputs"]}


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_image_bytes_equal_the_tensor_door(prepost_server: Server, fmt: str) -> None:
    files = [photo(96, 64, seed=1, fmt=fmt), photo(64, 80, seed=2, fmt=fmt)]
    status, doc = infer(prepost_server, "img",
                        {"image": ("BYTES", [2], byte_elements(*files))})
    assert status == 200, doc
    tensor = decoded(*files)
    status, ref = infer(prepost_server, "img",
                        {"input": ("FP32", list(tensor.shape), tensor.tobytes())})
    assert status == 200, ref
    got, want = outputs_by_name(doc), outputs_by_name(ref)
    logits = np.asarray(want["logits"]["data"], np.float32).reshape(2, CLASSES)
    assert np.allclose(got["logits"]["data"], logits.reshape(-1), atol=1e-5)
    assert got["class"]["data"] == logits.argmax(axis=1).tolist()
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    first = got["top2"]["data"][0].split(":")
    best = int(logits[0].argmax())
    assert int(first[1]) == best and first[2] == LABELS[best]
    assert float(first[0]) == pytest.approx(probabilities[0, best], abs=1e-5)
    assert got["top2"]["shape"] == [2, 2]


def test_classification_extension_as_triton_has_it(prepost_server: Server) -> None:
    tensor = decoded(photo(seed=4))
    status, doc = infer(prepost_server, "img",
                        {"input": ("FP32", list(tensor.shape), tensor.tobytes())},
                        outputs=[{"name": "logits", "parameters": {"classification": 3}}])
    assert status == 200, doc
    out = outputs_by_name(doc)["logits"]
    assert out["datatype"] == "BYTES" and out["shape"] == [1, 3]
    values = [float(s.split(":")[0]) for s in out["data"]]
    indices = [int(s.split(":")[1]) for s in out["data"]]
    assert values == sorted(values, reverse=True)
    assert all(s.split(":")[2] == LABELS[i] for s, i in zip(out["data"], indices, strict=True))
    status, meta = prepost_server.request("GET", "/v2")
    assert "classification" in orjson.loads(meta)["extensions"]


@pytest.mark.parametrize(("raw", "words"), [
    (b"\xff\xd8\xff\xe0 not really a jpeg", "not a JPEG, PNG or WebP"),
    (b"", "empty"),
    (photo()[: len(photo()) // 2], "cannot decode"),
    (png_header(20_000, 20_000), "pixels allowed"),
    (png_header(2_000, 1_000), "pixels allowed"),
    (b"GIF89a" + b"\x00" * 40, "not a JPEG, PNG or WebP"),
], ids=["corrupt", "empty", "truncated", "20000x20000", "over-max-pixels", "gif"])
def test_bad_images_are_a_400_naming_the_input(prepost_server: Server, raw: bytes,
                                                words: str) -> None:
    status, doc = infer(prepost_server, "img", {"image": ("BYTES", [1], byte_elements(raw))})
    assert status == 400, doc
    assert "'image'" in doc["error"] and words in doc["error"]
    assert "\n" not in doc["error"]
    status, _ = infer(prepost_server, "img",
                      {"image": ("BYTES", [1], byte_elements(photo()))})
    assert status == 200  # the server serves on


def test_raw_and_tensor_input_together_are_refused(prepost_server: Server) -> None:
    tensor = decoded(photo())
    status, doc = infer(prepost_server, "img", {
        "image": ("BYTES", [1], byte_elements(photo())),
        "input": ("FP32", list(tensor.shape), tensor.tobytes())})
    assert status == 400 and "'image'" in doc["error"]


def token_tensors(text: str) -> tuple[np.ndarray, np.ndarray]:
    """The client's own tokenization: the WordLevel vocabulary, truncated at 6."""
    vocab = {w: i + 2 for i, w in enumerate(WORDS)}
    ids = np.array([[vocab.get(w, 1) for w in text.split()][:6]], np.int64)
    return ids, np.ones_like(ids)


def embedding_of(doc: dict[str, Any]) -> np.ndarray:
    out = outputs_by_name(doc)["embedding"]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def test_strings_equal_the_tensor_door(prepost_server: Server) -> None:
    texts = [b"the cat sat on a mat", b"dog ran"]
    status, doc = infer(prepost_server, "txt", {"text": ("BYTES", [2], byte_elements(*texts))})
    assert status == 200, doc
    got = embedding_of(doc)
    assert got.shape == (2, 8)
    for row, text in enumerate(texts):
        ids, mask = token_tensors(text.decode())
        status, ref = infer(prepost_server, "txt", {
            "input_ids": ("INT64", list(ids.shape), ids.tobytes()),
            "attention_mask": ("INT64", list(mask.shape), mask.tobytes())})
        assert status == 200, ref
        want = embedding_of(ref)[0]
        assert float(got[row] @ want) == pytest.approx(1.0, abs=1e-5)


def test_ragged_requests_batch_together(prepost_server: Server) -> None:
    texts = [b"the cat", b"the quick brown dog ran far away", b"a mat", b"dog"]
    alone = [embedding_of(infer(prepost_server, "txt",
                                {"text": ("BYTES", [1], byte_elements(t))})[1])[0]
             for t in texts]
    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(lambda t: infer(prepost_server, "txt", {
            "text": ("BYTES", [1], byte_elements(t))}), texts * 4))
    for index, (status, doc) in enumerate(results):
        assert status == 200, doc
        assert np.allclose(embedding_of(doc)[0], alone[index % len(texts)], atol=1e-5)


@pytest.mark.parametrize(("raw", "words"), [
    (b"", "empty"), (b"caf\xe9 au lait", "not UTF-8")], ids=["empty", "latin-1"])
def test_bad_strings_are_a_400_naming_the_input(prepost_server: Server, raw: bytes,
                                                 words: str) -> None:
    status, doc = infer(prepost_server, "txt", {"text": ("BYTES", [1], byte_elements(raw))})
    assert status == 400, doc
    assert "'text'" in doc["error"] and words in doc["error"]


def test_metrics_split_pre_and_post_processing(prepost_server: Server) -> None:
    infer(prepost_server, "img", {"image": ("BYTES", [1], byte_elements(photo()))})
    _status, body = prepost_server.request("GET", "/metrics")
    text = body.decode()
    assert 'turboinfer_preprocess_duration_seconds_count{model="img",version="1"}' in text
    assert 'turboinfer_postprocess_duration_seconds_count{model="img",version="1"}' in text
