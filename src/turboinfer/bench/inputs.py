"""Inputs for a benchmark: the zoo's real examples, or seeded random data from specs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError
from turboinfer.shapes import DeclaredInput, concrete_shape

# The size used for a dynamic non-batch axis (e.g. sequence length) when nothing says.
DEFAULT_DYNAMIC_SIZE = 128
# The range of an integer input whose size nothing tells (token ids of an unknown vocabulary).
SMALL_INTS = 100


def declared_inputs(specs: list[TensorSpec]) -> list[DeclaredInput]:
    """The specs as shape flags see them: symbolic or unknown sizes are dynamic."""
    return [DeclaredInput(spec.name, tuple(d if isinstance(d, int) and d > 0 else None
                                           for d in spec.shape))
            for spec in specs]


def random_feeds(
    specs: list[TensorSpec],
    batch_size: int,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Seeded random inputs matching ``specs``; the batch axis takes ``batch_size``.

    ``shapes`` gives an input's shape without its batch axis (:mod:`turboinfer.shapes`);
    other dynamic axes take ``DEFAULT_DYNAMIC_SIZE``. Integer inputs are read by their
    names (``integer_feed``) so that they stay valid indices.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec, declared in zip(specs, declared_inputs(specs), strict=True):
        shape = concrete_shape(declared, batch_size, shapes or {},
                               dynamic_size=DEFAULT_DYNAMIC_SIZE)
        if np.issubdtype(spec.dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif np.issubdtype(spec.dtype, np.integer):
            feeds[spec.name] = integer_feed(spec.name, shape, SMALL_INTS, rng).astype(spec.dtype)
        elif spec.dtype == np.bool_:
            feeds[spec.name] = np.ones(shape, dtype=np.bool_)
        else:
            raise ConfigError(f"cannot make random data for input {spec.name!r} of {spec.dtype}")
    return feeds


def integer_feed(name: str, shape: tuple[int, ...], high: int,
                 rng: np.random.Generator) -> np.ndarray:
    """An integer input as what its name says it usually is: attention masks all ones,
    token type / segment ids zeros (BERT's type vocabulary holds 2: random values ran past
    it, and ONNX Runtime's Gather refused them), position ids ``0..S-1``, anything else
    ids in ``[0, high)``."""
    lower = name.lower()
    if "mask" in lower:
        return np.ones(shape, np.int64)
    if "type" in lower or "segment" in lower:
        return np.zeros(shape, np.int64)
    if "position" in lower and len(shape) >= 2:
        return np.broadcast_to(np.arange(shape[-1]), shape).copy()
    return rng.integers(0, high, size=shape)
