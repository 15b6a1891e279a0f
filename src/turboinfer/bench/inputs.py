"""Inputs for a benchmark: the zoo's real examples, or seeded random data from specs."""

from __future__ import annotations

import numpy as np

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError

# The size used for a dynamic non-batch axis (e.g. sequence length) when nothing says.
DEFAULT_DYNAMIC_SIZE = 128


def random_feeds(
    specs: list[TensorSpec],
    batch_size: int,
    *,
    shapes: dict[str, tuple[int, ...]] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Seeded random inputs matching ``specs``; axis 0 takes ``batch_size`` when dynamic.

    ``shapes`` overrides a whole input shape (without the batch axis when it is dynamic).
    Integer inputs get small non-negative values so they are valid token ids / indices.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        shape = _concrete_shape(spec, batch_size, (shapes or {}).get(spec.name))
        if np.issubdtype(spec.dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif np.issubdtype(spec.dtype, np.integer):
            feeds[spec.name] = rng.integers(0, 100, size=shape).astype(spec.dtype)
        elif spec.dtype == np.bool_:
            feeds[spec.name] = np.ones(shape, dtype=np.bool_)
        else:
            raise ConfigError(f"cannot make random data for input {spec.name!r} of {spec.dtype}")
    return feeds


def _concrete_shape(
    spec: TensorSpec, batch_size: int, override: tuple[int, ...] | None
) -> tuple[int, ...]:
    dims = list(spec.shape)
    batch_dynamic = bool(dims) and not isinstance(dims[0], int)
    if override is not None:
        return (batch_size, *override) if batch_dynamic else tuple(override)
    concrete = []
    for axis, dim in enumerate(dims):
        if isinstance(dim, int) and dim > 0:
            concrete.append(dim)
        elif axis == 0:
            concrete.append(batch_size)
        else:
            concrete.append(DEFAULT_DYNAMIC_SIZE)
    return tuple(concrete)
