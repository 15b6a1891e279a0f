"""The model every system serves: an MLP in ONNX, 256 -> 1024 -> 1024 -> 10, float32,
with a dynamic batch axis. About 1.3 M multiply-adds per row: small enough that a
server's own overhead shows, large enough that batching pays.

``WIDE_WIDTHS``: the same layout at 1024 -> 4096 -> 4096 -> 4096 -> 10, 151 MB of fp32
weights, several times the last-level cache: one row is a memory-bound pass over every
weight, 32 rows reuse each weight 32 times for little more time. The model where the
compute per request dominates the server's own cost, and batching amortises it."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTHS = (256, 1024, 1024, 10)
WIDE_WIDTHS = (1024, 4096, 4096, 4096, 10)


def write_mlp(path: Path, widths: tuple[int, ...] = WIDTHS) -> Path:
    rng = np.random.default_rng(0)
    nodes, inits, previous = [], [], "input"
    for i, (n_in, n_out) in enumerate(pairwise(widths)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(np.zeros(n_out, np.float32), f"b{i}")]
        out = "output" if i == len(widths) - 2 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [previous, f"w{i}", f"b{i}"], [f"g{i}"]))
        nodes.append(helper.make_node("Identity" if out == "output" else "Relu",
                                      [f"g{i}"], [out]))
        previous = out
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", widths[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", widths[-1]])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
