"""Text pre-processing in the server: UTF-8 strings in, token ids and masks out.

The model's own tokenizer (``tokenizer.json``, Hugging Face tokenizers) encodes a
request's strings, truncated at the model's length and padded to the request's longest;
the batcher pads a batch of requests to its longest again (``ragged`` inputs), so a
short sentence never pays for a long one's padding beyond its own batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from turboinfer.engines import TensorSpec
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.serve.datatypes import as_bytes
from turboinfer.serve.prepost_config import DEFAULT_MAX_LENGTH, TextPreprocess

# Above this many bytes of text a request is tokenized on a worker thread (tokenizers
# releases the GIL) rather than on the event loop.
INLINE_BYTES = 4096


class TextEncoder:
    """One text input of a model."""

    def __init__(self, settings: TextPreprocess, specs: dict[str, TensorSpec]) -> None:
        self.settings = settings
        path = Path(settings.tokenizer)
        if not path.is_file():
            raise ConfigError(f"preprocess text: tokenizer file {path} not found")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise ConfigError(f"preprocess text: cannot read tokenizer {path}: {exc}") from None
        self.max_length = settings.max_length or _tokenizer_length(tokenizer)
        tokenizer.no_padding()  # padded below, to the request's longest
        tokenizer.enable_truncation(self.max_length)
        self.tokenizer = tokenizer
        if settings.ids not in specs or settings.mask not in specs:
            raise ConfigError(f"preprocess text: the model needs inputs {settings.ids!r} and "
                              f"{settings.mask!r}; it takes {', '.join(specs)}")
        self.dtypes = {name: specs[name].dtype for name in settings.outputs if name in specs}

    @property
    def fills(self) -> tuple[str, ...]:
        return tuple(self.dtypes)

    def wants_thread(self, texts: np.ndarray) -> bool:
        return sum(len(as_bytes(t)) for t in texts.reshape(-1)) > INLINE_BYTES

    def encode(self, name: str, texts: np.ndarray) -> dict[str, np.ndarray]:
        """``texts``: BYTES ``[N]`` or ``[N, 1]`` -> the model's token inputs ``[N, L]``."""
        if texts.ndim == 2 and texts.shape[1] == 1:
            texts = texts[:, 0]
        if texts.ndim != 1 or texts.shape[0] < 1:
            raise InvalidInputError(f"input {name!r}: expected shape [N] or [N, 1] of "
                                    f"strings, got {list(texts.shape)}")
        strings = [_text(name, i, value) for i, value in enumerate(texts)]
        encodings = self.tokenizer.encode_batch(strings)
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), np.int64)  # 0: [PAD] in BERT vocabularies
        mask = np.zeros((len(encodings), width), np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        s = self.settings
        produced = {s.ids: ids, s.mask: mask, s.type_ids: np.zeros_like(ids)}
        return {n: produced[n].astype(dtype, copy=False) for n, dtype in self.dtypes.items()}


def _text(name: str, index: int, value: object) -> str:
    where = f"input {name!r}" + (f" element {index}" if index else "")
    try:
        raw = as_bytes(value)
    except TypeError:
        raise InvalidInputError(f"{where}: not a BYTES element") from None
    if not raw:
        raise InvalidInputError(f"{where}: the string is empty")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{where}: not UTF-8 text (byte {exc.start})") from None


def _tokenizer_length(tokenizer: Tokenizer) -> int:
    truncation = tokenizer.truncation
    if truncation and truncation.get("max_length"):
        return int(truncation["max_length"])
    return DEFAULT_MAX_LENGTH
