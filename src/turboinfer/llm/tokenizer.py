"""Text <-> token ids through the ``tokenizers`` package (a folder's ``tokenizer.json``),
with the special tokens added as ``transformers`` adds them.

A prompt gets what the tokenizer's own rules give it, never a BOS the model's config
names on its own (SmolLM2's config names a BOS its tokenizer does not add; prepending it
changed every completion from the first token):

- ``tokenizer.json``'s post-processor decides (a BERT template adds [CLS] and [SEP], a
  byte-level one adds nothing, a Llama template adds ``<s>``); ``transformers`` 5 follows
  it too, and leaves ``tokenizer_config.json``'s ``add_bos_token`` / ``add_eos_token``
  aside (its converters write them into the template);
- the padding and truncation a ``tokenizer.json`` may carry (MiniLM's pads to 128) are
  off: a prompt is its own length, and the engine bounds it by the context.

A chat prompt is rendered by the template, which writes its own special tokens as text,
and encoded without adding any (``add_special_tokens=False``), as ``apply_chat_template``
does. The stop ids are the model config's ``eos_token_id`` together with
``generation_config.json``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from turboinfer.errors import ModelLoadError


class Tokenizer:
    def __init__(self, inner: _HFTokenizer, *, eos_token_ids: tuple[int, ...] = (),
                 bos_token: str | None = None) -> None:
        self.inner = inner
        self.eos_token_ids = eos_token_ids
        self.bos_token = bos_token
        self.bos_token_id = None if bos_token is None else inner.token_to_id(bos_token)

    @classmethod
    def from_folder(cls, folder: Path, *, eos_token_ids: tuple[int, ...] = ()) -> Tokenizer:
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: no tokenizer.json")
        try:
            inner = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise ModelLoadError(f"{path}: cannot read tokenizer ({exc})") from None
        inner.no_padding()
        inner.no_truncation()
        bos = token_text(_json_file(folder / "tokenizer_config.json").get("bos_token"))
        stops = tuple(dict.fromkeys((*eos_token_ids, *generation_stop_ids(folder))))
        return cls(inner, eos_token_ids=stops, bos_token=bos)

    @property
    def vocab_size(self) -> int:
        return int(self.inner.get_vocab_size())

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``; with the special tokens the tokenizer's rules add (a plain
        prompt) or without (a rendered chat prompt, which writes its own)."""
        ids: list[int] = self.inner.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=True))


def token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an AddedToken
    dict with its ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def generation_stop_ids(folder: Path) -> tuple[int, ...]:
    """``generation_config.json``'s ``eos_token_id`` (an id or a list of them)."""
    value = _json_file(folder / "generation_config.json").get("eos_token_id")
    ids = value if isinstance(value, list) else [value]
    return tuple(int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool))


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from None
    return data if isinstance(data, dict) else {}
