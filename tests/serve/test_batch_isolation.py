"""One bad request in a merged batch fails alone: the engine's error on the batch makes
the batcher run each request by itself, so the others are answered."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from turboinfer.serve.config import DynamicBatching, ModelConfig, write_entry

if TYPE_CHECKING:
    from conftest import Server

VOCAB, WIDTH, TOKENS = 10, 8, 4
# A batch forms only when four rows wait (the delay is far longer than any test), so the
# four concurrent requests below always run as one merged batch first.
GATHER_CONFIG = ModelConfig(max_batch_size=8, dynamic_batching=DynamicBatching(
    max_queue_delay_ms=60_000, preferred_batch_sizes=(4,)))


def make_gather_onnx(path: Path) -> Path:
    """An embedding lookup: ``output[b, t] = table[ids[b, t]]``; ids >= VOCAB are out of
    range, which ONNX Runtime reports as an invalid argument."""
    table = np.arange(VOCAB * WIDTH, dtype=np.float32).reshape(VOCAB, WIDTH)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["output"], axis=0)], "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", TOKENS])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                       ["batch", TOKENS, WIDTH])],
        initializer=[numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def ids_request(ids: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, TOKENS],
                        "data": ids}]}


@pytest.fixture(scope="module")
def gather_server(tmp_path_factory: pytest.TempPathFactory, launch: Any) -> Any:
    root = tmp_path_factory.mktemp("gather-repo")
    model = make_gather_onnx(tmp_path_factory.mktemp("gather") / "gather.onnx")
    write_entry(root, "gather", model, GATHER_CONFIG)
    server: Server = launch(root, tmp_path_factory.mktemp("log") / "server.log")
    yield server
    assert server.stop() == 0


def test_only_the_guilty_request_of_a_batch_fails(gather_server: Server) -> None:
    bodies = [ids_request([1, 2, 3, 4]), ids_request([0, 5, VOCAB + 90, 1]),
              ids_request([9, 8, 7, 6]), ids_request([0, 0, 0, 0])]
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(
            lambda body: gather_server.post_json("/v2/models/gather/infer", body), bodies))
    statuses = [status for status, _ in replies]
    assert statuses == [200, 400, 200, 200], replies
    assert "error" in replies[1][1]
    first = np.array(replies[0][1]["outputs"][0]["data"], np.float32).reshape(TOKENS, WIDTH)
    assert first[0, 0] == 1 * WIDTH  # row 1 of the table: the request got its own rows
