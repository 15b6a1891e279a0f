"""Dynamic axes other than the batch axis have a largest size (config.yaml ``max_dims``,
else ``max_dynamic_dim``): a request over it gets 400 before the engine runs, and a
limit the model cannot take is refused when the entry loads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from turboinfer.errors import InvalidInputError, UnavailableError
from turboinfer.serve.config import ModelConfig, write_entry
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.protocol import InferRequest
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import scan_directory


def _sequence_model(path: Path) -> Path:
    """``output = relu(tokens)`` over ``[batch, seq, 4]``: a dynamic non-batch axis."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["tokens"], ["output"])], "seq",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _infer(root: Path, seq: int) -> np.ndarray:
    async def scenario() -> np.ndarray:
        repo = Repository(scan_directory(root), Metrics(), root=root, drain_timeout_s=5)
        await repo.load_all()
        try:
            request = InferRequest(inputs={"tokens": np.ones((1, seq, 4), np.float32)})
            return (await repo.get("seq").infer(request))["output"]
        finally:
            await repo.close()

    return asyncio.run(scenario())


@pytest.mark.parametrize("config, limit", [
    (ModelConfig(max_batch_size=8, max_dims={"tokens": [None, 16, None]}), 16),
    (ModelConfig(max_batch_size=8, max_dynamic_dim=32), 32),
    (ModelConfig(max_dims={"tokens": [None, 16, None]}), 16),  # no batching: axis 0 too
])
def test_a_dynamic_axis_over_its_limit_is_refused(tmp_path: Path, config: ModelConfig,
                                                  limit: int) -> None:
    write_entry(tmp_path, "seq", _sequence_model(tmp_path / "seq.onnx"), config)
    assert _infer(tmp_path, limit).shape == (1, limit, 4)
    with pytest.raises(InvalidInputError, match=rf"has {limit + 1} on axis 1, over the "
                                                 rf"model's limit of {limit}"):
        _infer(tmp_path, limit + 1)


@pytest.mark.parametrize("max_dims, problem", [
    ({"ids": [None, 16, None]}, "names 'ids', which is no input"),
    ({"tokens": [None, 16]}, "has 2 axes, the input 3"),
    ({"tokens": [None, 16, 8]}, "sets axis 2, which is fixed"),
    ({"tokens": [4, 16, None]}, "sets axis 0, which is the batch axis"),
])
def test_a_limit_the_model_cannot_take_fails_its_load(tmp_path: Path,
                                                      max_dims: dict[str, list[int | None]],
                                                      problem: str) -> None:
    config = ModelConfig(max_batch_size=8, max_dims=max_dims)
    write_entry(tmp_path, "seq", _sequence_model(tmp_path / "seq.onnx"), config)

    async def scenario() -> None:
        repo = Repository(scan_directory(tmp_path), Metrics(), root=tmp_path,
                          drain_timeout_s=5)
        try:
            await repo.load_all()
            [entry] = repo.index()
            assert entry["state"] == "UNAVAILABLE" and problem in entry["reason"]
            with pytest.raises(UnavailableError, match=problem):
                repo.get("seq")
        finally:
            await repo.close()

    asyncio.run(scenario())
