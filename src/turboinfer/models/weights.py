"""Trained weights and reference outputs, computed once and kept in the cache.

Keys carry the entry's version, so changing how a model is built or trained changes the
key instead of silently reusing old files. A file that fails to load (truncated by a
crash in another tool, edited by hand, from another torch) is recomputed, not trusted.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from turboinfer.models.cache import atomic_path, cache_dir

M = TypeVar("M", bound=torch.nn.Module)

_UNREADABLE = (OSError, RuntimeError, ValueError, EOFError, KeyError, pickle.UnpicklingError)


def cached_state_dict(key: str, model: M, fill: Callable[[M], M]) -> M:
    """Load ``model``'s weights from the cache, or ``fill`` them (train, seed) and store them."""
    path = _path("weights", f"{key}.pt")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
        return model.eval()
    except _UNREADABLE:
        pass
    model = fill(model).eval()
    with atomic_path(path) as tmp:
        torch.save(model.state_dict(), tmp)
    return model


def cached_array(key: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """Load an array (e.g. FP32 reference outputs) from the cache, or compute and store it."""
    path = _path("reference", f"{key}.npy")
    try:
        return np.load(path, allow_pickle=False)
    except _UNREADABLE:
        pass
    array = np.ascontiguousarray(compute())
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        # A file object: np.save given a name would append ".npy" to the temporary name.
        np.save(f, array, allow_pickle=False)
    return array


def _path(kind: str, name: str) -> Path:
    return cache_dir() / kind / name
