"""Random inputs stay valid indices: a BERT-style model's token types index a table of two
rows, its attention mask is 0/1, and bench runs it on the random data it makes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from turboinfer.bench.inputs import random_feeds
from turboinfer.cli import main
from turboinfer.engines.base import TensorSpec


def _bert_like(path: Path) -> Path:
    """ids [batch, seq] through a 100-row table plus token types through a 2-row one,
    scaled by the attention mask."""
    rng = np.random.default_rng(0)
    words = numpy_helper.from_array(rng.standard_normal((100, 8)).astype(np.float32), "words")
    types = numpy_helper.from_array(rng.standard_normal((2, 8)).astype(np.float32), "types")
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
            for n in ("input_ids", "token_type_ids", "attention_mask")]
    nodes = [helper.make_node("Gather", ["words", "input_ids"], ["w"]),
             helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
             helper.make_node("Add", ["w", "t"], ["s"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axis"], ["m3"]),
             helper.make_node("Mul", ["s", "m3"], ["output"])]
    axis = numpy_helper.from_array(np.array([2], np.int64), "axis")
    graph = helper.make_graph(nodes, "bert_like", ints, [helper.make_tensor_value_info(
        "output", TensorProto.FLOAT, ["batch", "seq", 8])], initializer=[words, types, axis])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_integer_inputs_are_read_by_their_names() -> None:
    specs = [TensorSpec(n, np.dtype("int64"), ("batch", "seq"))
             for n in ("input_ids", "token_type_ids", "attention_mask", "position_ids")]
    feeds = random_feeds(specs, 2, shapes={n: (6,) for n in (s.name for s in specs)})
    assert np.all(feeds["attention_mask"] == 1) and np.all(feeds["token_type_ids"] == 0)
    assert feeds["position_ids"].tolist() == [list(range(6))] * 2
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 100


def test_bench_runs_a_model_with_a_two_row_type_table(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    model = _bert_like(tmp_path / "bert_like.onnx")
    assert main(["bench", str(model), "--engines", "onnxruntime", "--batch-sizes", "1",
                 "--min-runs", "3", "--min-seconds", "0", "--warmup", "1"]) == 0, \
        capsys.readouterr().err
