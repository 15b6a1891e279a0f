"""The project's cache folder: ``$TURBOINFER_CACHE_DIR`` if set, else the user cache
folder. Downloaded and exported models, converted GGUF files, compiled native libraries,
TensorRT engines and the LLM kernel choices each keep a subfolder of it. In the bottom
layer, so that every layer resolves it in this one place."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

ENV_VAR = "TURBOINFER_CACHE_DIR"


def cache_folder(*parts: str, create: bool = False) -> Path:
    """The cache folder, or ``parts`` inside it; made (with its parents) when ``create``."""
    override = os.environ.get(ENV_VAR)
    root = Path(override).expanduser() if override else Path(
        platformdirs.user_cache_dir("turboinfer"))
    path = root.joinpath(*parts)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
