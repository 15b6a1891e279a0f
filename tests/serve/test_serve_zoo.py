"""``turboinfer serve`` with no repository serves the built-in zoo."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from turboinfer.engines import load_session
from turboinfer.models import resolve_model

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.slow  # the first run trains and exports digits-cnn


@pytest.fixture(scope="module")
def zoo_server(tmp_path_factory: pytest.TempPathFactory,
               launch: Callable[..., Server]) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("zoo") / "server.log"
    server = launch(None, log, "--zoo-models", "digits-cnn", timeout=600, cli=True)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def expected() -> tuple[np.ndarray, np.ndarray]:
    model = resolve_model("builtin:digits-cnn")
    assert model.entry is not None
    x = model.entry.example_inputs(4)["input"]
    logits = load_session(model.artifact).run({"input": x})["logits"]
    return x, logits


@pytest.mark.parametrize("binary", [True, False])
def test_http(zoo_server: Server, expected: tuple[np.ndarray, np.ndarray],
              binary: bool) -> None:
    x, logits = expected
    client = httpclient.InferenceServerClient(zoo_server.http_url)
    assert client.get_model_metadata("digits-cnn")["inputs"][0]["shape"] == [-1, 1, 8, 8]
    assert client.get_model_config("digits-cnn")["max_batch_size"] == 32
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    output = httpclient.InferRequestedOutput("logits", binary_data=binary)
    result = client.infer("digits-cnn", [tensor], outputs=[output])
    np.testing.assert_allclose(result.as_numpy("logits"), logits, rtol=1e-4, atol=1e-4)
    stats = client.get_inference_statistics("digits-cnn")["model_stats"][0]
    assert stats["inference_count"] >= 4
    index = client.get_model_repository_index()
    assert {"name": "digits-cnn", "version": "1", "state": "READY", "reason": ""} in index
    # The rest of the zoo is listed, not built: it loads through the repository API.
    assert {"name": "resnet50", "state": "UNAVAILABLE", "reason": "not loaded"} in index
    client.close()


def test_grpc(zoo_server: Server, expected: tuple[np.ndarray, np.ndarray]) -> None:
    x, logits = expected
    client = grpcclient.InferenceServerClient(zoo_server.grpc_url)
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("digits-cnn", [tensor])
    np.testing.assert_allclose(result.as_numpy("logits"), logits, rtol=1e-4, atol=1e-4)
    assert client.get_model_config("digits-cnn", as_json=True)["config"]["name"] == "digits-cnn"
    client.unload_model("digits-cnn")
    assert not client.is_model_ready("digits-cnn")
    client.load_model("digits-cnn")
    assert client.is_model_ready("digits-cnn")
    client.close()


