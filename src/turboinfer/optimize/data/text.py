"""A file of text lines as calibration inputs for a text model: each line tokenized with
the model folder's own ``tokenizer.json`` (Hugging Face tokenizers), truncated at its
length, padded to the longest line, with the attention mask and zero token types the
model takes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError, InvalidInputError

MAX_LENGTH = 512  # when the tokenizer sets no truncation (BERT's positions)
IDS, MASK, TYPES = "input_ids", "attention_mask", "token_type_ids"


def load_text(path: Path, tokenizer_path: Path | None, specs: list[TensorSpec],
              limit: int) -> dict[str, np.ndarray]:
    """Up to ``limit`` non-empty lines of ``path`` as the model's token inputs."""
    names = {spec.name for spec in specs}
    if IDS not in names or not names <= {IDS, MASK, TYPES}:
        raise InvalidInputError(f"--calib-text needs a model taking {IDS} (and "
                                f"{MASK}, {TYPES}); this one takes {', '.join(sorted(names))}")
    lines = _lines(path)[:limit]
    tokenizer = _tokenizer(tokenizer_path)
    encodings = tokenizer.encode_batch(lines)
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(lines), width), np.int64)  # 0: [PAD] in BERT vocabularies
    mask = np.zeros_like(ids)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    made = {IDS: ids, MASK: mask, TYPES: np.zeros_like(ids)}
    return {spec.name: made[spec.name].astype(spec.dtype) for spec in specs}


def _lines(path: Path) -> list[str]:
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--calib-text {path}: cannot read UTF-8 lines: {exc}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ConfigError(f"--calib-text {path}: no text lines")
    return lines


def _tokenizer(path: Path | None) -> Tokenizer:
    if path is None or not path.is_file():
        raise ConfigError("--calib-text needs the model's tokenizer.json: give the model as "
                          "its folder (holding tokenizer.json) or pass --tokenizer FILE")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception type
        raise ConfigError(f"cannot read tokenizer {path}: {exc}") from None
    truncation = tokenizer.truncation
    tokenizer.no_padding()
    tokenizer.enable_truncation(int(truncation["max_length"]) if truncation else MAX_LENGTH)
    return tokenizer
