"""Synthetic calibration inputs drawn from the model's input specs, for users with no
data at hand. Real data is always better: ranges and the fidelity check then describe
this distribution only, which the run says loudly.

Floats are standard normal. Integer inputs are read as what they usually are: token
ids take values in ``[0, vocab)`` when an embedding table (a ``Gather`` on the input)
gives the vocabulary size, else small integers; attention masks are all ones, token
type ids zeros, position ids ``0..S-1``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from turboinfer.bench.inputs import integer_feed, random_feeds
from turboinfer.engines.base import TensorSpec

SMALL_INTS = 16  # the range of an integer input whose meaning nothing tells
# Ops that pass a tensor through unchanged in value, between an input and its Gather.
_PASS_THROUGH = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten"})


def vocab_sizes(model_path: Path) -> dict[str, int]:
    """Input name -> rows of the embedding table it indexes, where one does."""
    model = onnx.load(str(model_path), load_external_data=False)
    rows = {init.name: int(init.dims[0]) for init in model.graph.initializer if init.dims}
    origin = {i.name: i.name for i in model.graph.input}
    sizes: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in _PASS_THROUGH and node.input and node.input[0] in origin:
            origin[node.output[0]] = origin[node.input[0]]
        elif (node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in origin
              and node.input[0] in rows):
            name = origin[node.input[1]]
            sizes[name] = max(sizes.get(name, 0), rows[node.input[0]])
    return sizes


def synthetic_feeds(specs: list[TensorSpec], count: int, model_path: Path | None, *,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """``count`` samples per input; the same seed gives the same samples. The model file,
    when given, tells vocabulary sizes."""
    feeds = random_feeds(specs, count, seed=seed)
    vocab = vocab_sizes(model_path) if model_path is not None else {}
    rng = np.random.default_rng(seed + 1)
    for spec in specs:
        if np.issubdtype(spec.dtype, np.integer):
            shape = feeds[spec.name].shape
            feeds[spec.name] = integer_feed(spec.name, shape,
                                            vocab.get(spec.name) or SMALL_INTS,
                                            rng).astype(spec.dtype)
    return feeds

